#!/usr/bin/env bash
# make image-test: the image built with the project's Dockerfile and run, and
# deploy/compose run, on a machine that has no registry to pull from. As root it
# installs Debian's engine when missing (docker.io: dockerd with BuildKit, containerd,
# runc; docker-compose 1.29; debootstrap), starts dockerd unless one already answers,
# makes the stand-in bases the Dockerfile names (golang:$GO_VERSION from a debootstrapped
# bookworm plus this machine's Go toolchain; gcr.io/distroless/static-debian12:nonroot
# from passwd/group with nonroot 65532, a CA bundle, zoneinfo and /tmp) unless present,
# builds the image, and checks, everything on 127.0.0.1:
#   --help exits 0 and --version names the build's VERSION;
#   the README's flow through the container (host network) answers 202 with
#   secrets=preserved; the process runs as uid/gid 65532 (/proc); /healthz and /readyz
#   answer 200; the state file in a named volume is mode 0600, owner 65532;
#   SIGTERM during a slow 221 KB upload: /readyz turns 503, the PUT gets its 202, exit 0
#   well within --shutdown-timeout;
#   deploy/compose/compose.yaml, unchanged, up with stand-ins for APISIX (the emulator)
#   and ADC (integration/cmd/adc-server): ports published on 127.0.0.1 only, the
#   compose-built confshim reports the VERSION compose passes, the README's sync through
#   ADC, the out-of-band secrets manager, and the next sync lands with secrets=preserved;
#   then down.
# It stops every container, network and volume it made and the dockerd it started; the
# installed packages, the stand-in bases and the debootstrapped root
# ($IMAGE_TEST_CACHE, default /var/cache/confshim-image-test) stay for the next run.
# Without root it says why it skips.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
START=$(date +%s.%N)

say() { printf '%s image-test: %s\n' "$(date +%T)" "$*"; }
fail() {
	say "FAIL: $*"
	exit 1
}

if [ "$(id -u)" != 0 ]; then
	echo "SKIPPED make image-test: it needs root (installs docker.io, starts dockerd, debootstraps the stand-in bases); run it as root"
	exit 0
fi

CACHE=${IMAGE_TEST_CACHE:-/var/cache/confshim-image-test}
GO=${GO:-go}
GO_VERSION=$(sed -n 's/^ARG GO_VERSION=//p' Dockerfile)
BUILDER_IMAGE=golang:$GO_VERSION
STATIC_IMAGE=$(sed -n 's/^FROM \(gcr.io[^ ]*\).*/\1/p' Dockerfile)
APISIX_IMAGE=$(sed -n 's/^ *image: *\(apache\/apisix[^ ]*\).*/\1/p' deploy/compose/compose.yaml)
ADC_IMAGE=$(sed -n 's/^ *image: *\(ghcr.io\/api7\/adc[^ ]*\).*/\1/p' deploy/compose/compose.yaml)
VERSION=${VERSION:-$(git describe --tags --always --dirty 2>/dev/null || echo dev)}
IMAGE=confshim:image-test
RUN_ID=cit$$
LABEL=org.confshim.image-test=$RUN_ID
KEY=image-test-$(head -c 8 /dev/urandom | od -An -tx1 | tr -d ' \n')
WORK=$(mktemp -d /tmp/confshim-image-test.XXXXXX)
DOCKER=/usr/bin/docker # Debian's 20.10 CLI: BuildKit without a buildx plugin
export DOCKER_BUILDKIT=1
[ -n "$GO_VERSION" ] && [ -n "$STATIC_IMAGE" ] && [ -n "$APISIX_IMAGE" ] && [ -n "$ADC_IMAGE" ] ||
	fail "cannot read the base images from Dockerfile and deploy/compose/compose.yaml"

# --- cleanup: containers, volumes, compose project, stand-in tags, the dockerd we started
DOCKERD_PID=
SAMPLER_PID=
COMPOSE_UP=
TAGGED=()
cleanup() {
	local rc=$?
	set +e
	if [ -n "$COMPOSE_UP" ]; then
		compose down -v --remove-orphans -t 5 >"$WORK/compose-down.log" 2>&1 || say "compose down failed: $(tail -3 "$WORK/compose-down.log")"
	fi
	if [ -S /var/run/docker.sock ] && timeout 10 $DOCKER info >/dev/null 2>&1; then
		ids=$($DOCKER ps -aq --filter "label=$LABEL")
		[ -n "$ids" ] && $DOCKER rm -f $ids >/dev/null
		vols=$($DOCKER volume ls -q --filter "label=$LABEL")
		[ -n "$vols" ] && $DOCKER volume rm $vols >/dev/null
		for t in "${TAGGED[@]}"; do $DOCKER rmi "$t" >/dev/null 2>&1; done
		$DOCKER rmi "$IMAGE" >/dev/null 2>&1
	fi
	[ -n "$SAMPLER_PID" ] && kill "$SAMPLER_PID" 2>/dev/null
	if [ -n "$DOCKERD_PID" ]; then
		# each run adds the layers of its builds (a new VERSION): the build cache stays
		# bounded, the most recently used kept (go's module and build caches among them)
		timeout 60 $DOCKER builder prune -f --keep-storage "${IMAGE_TEST_BUILD_CACHE:-512MB}" >/dev/null 2>&1
		kill "$DOCKERD_PID" 2>/dev/null
		for _ in $(seq 100); do kill -0 "$DOCKERD_PID" 2>/dev/null || break; sleep 0.2; done
		if kill -0 "$DOCKERD_PID" 2>/dev/null; then
			say "dockerd did not stop within 20 s: killed"
			kill -9 "$DOCKERD_PID" 2>/dev/null
		fi
		wait "$DOCKERD_PID" 2>/dev/null
		say "stopped the dockerd it started (pid $DOCKERD_PID)"
	fi
	if [ $rc = 130 ]; then
		say "interrupted after $(elapsed) s; logs kept in $WORK"
	elif [ $rc != 0 ]; then
		say "FAILED after $(elapsed) s; logs kept in $WORK"
	else
		rm -rf "$WORK"
	fi
	exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

elapsed() { echo "$(date +%s.%N) $START" | awk '{printf "%.1f", $1-$2}'; }

# wait_for SECONDS DESCRIPTION COMMAND…: polls every 0.1 s until COMMAND succeeds
wait_for() {
	local secs=$1 what=$2
	shift 2
	local deadline=$(($(date +%s) + secs))
	until "$@" >/dev/null 2>&1; do
		[ "$(date +%s)" -lt "$deadline" ] || fail "$what: not within ${secs}s"
		sleep 0.1
	done
}

# status URL [curl args…]: the HTTP status code only
status() {
	local url=$1
	shift
	curl -s -o /dev/null -w '%{http_code}' --max-time 10 "$@" "$url" || true
}
is200() { [ "$(status "$1")" = 200 ]; }
is503() { [ "$(status "$1")" = 503 ]; }

free_port() {
	local p
	for _ in $(seq 200); do
		p=$((20000 + RANDOM % 20000))
		ss -Hltn "sport = :$p" | grep -q . || { echo "$p"; return; }
	done
	fail "no free port"
}

# --- 1. the engine
need=()
command -v dockerd >/dev/null && [ -x /usr/bin/docker ] || need+=(docker.io)
command -v docker-compose >/dev/null || need+=(docker-compose)
command -v debootstrap >/dev/null || need+=(debootstrap)
for c in curl jq ss; do command -v $c >/dev/null || need+=("$c"); done
if [ ${#need[@]} -gt 0 ]; then
	need=("${need[@]/#ss/iproute2}")
	say "installing ${need[*]}"
	apt-get update -qq >"$WORK/apt.log" 2>&1 || fail "apt-get update: $(tail -3 "$WORK/apt.log")"
	DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -qq --no-install-recommends "${need[@]}" ca-certificates >>"$WORK/apt.log" 2>&1 ||
		fail "apt-get install ${need[*]}: $(tail -3 "$WORK/apt.log")"
fi

if timeout 10 $DOCKER info >/dev/null 2>&1; then
	say "a Docker engine already answers: using it (it stays running)"
else
	[ -S /var/run/docker.sock ] && rm -f /var/run/docker.sock # left by a dockerd that died
	dockerd >"$WORK/dockerd.log" 2>&1 &
	DOCKERD_PID=$!
	# a machine whose kernel or sandbox cannot run an engine (no overlay, no cgroups,
	# no network namespaces) is not this project's failure: it says so and skips, as
	# make vulncheck does without its database; IMAGE_TEST=require makes it an error
	deadline=$(($(date +%s) + 30))
	until $DOCKER info >/dev/null 2>&1; do
		if ! kill -0 "$DOCKERD_PID" 2>/dev/null || [ "$(date +%s)" -ge "$deadline" ]; then
			why="dockerd did not come up: $(tail -2 "$WORK/dockerd.log" | tr '\n' ' ' | cut -c1-300)"
			[ "${IMAGE_TEST:-}" = require ] && fail "$why"
			echo "SKIPPED make image-test: no container engine can run on this machine ($why)"
			exit 0
		fi
		sleep 0.1
	done
	say "dockerd $($DOCKER version -f '{{.Server.Version}}') up (pid $DOCKERD_PID, storage $($DOCKER info -f '{{.Driver}}'))"
	# every port this engine publishes, sampled through the run: all must be on 127.0.0.1
	while kill -0 "$DOCKERD_PID" 2>/dev/null; do
		ss -Hltnp 2>/dev/null | awk '/docker-proxy/{print $4}' >>"$WORK/published"
		sleep 0.2
	done &
	SAMPLER_PID=$!
fi

# --- 2. the stand-in bases, unless an image of that name is there (a real one included)
have_image() { $DOCKER image inspect "$1" >/dev/null 2>&1; }
standin() { [ "$($DOCKER image inspect -f '{{index .Config.Labels "org.confshim.standin"}}' "$1" 2>/dev/null)" != "" ]; }

bookworm=$CACHE/bookworm
MADE_BASE=
if ! have_image "$BUILDER_IMAGE" || ! have_image "$STATIC_IMAGE"; then
	if [ ! -f "$bookworm/.complete" ]; then
		say "debootstrap bookworm into $bookworm (about 30 s)"
		rm -rf "$bookworm" && mkdir -p "$CACHE"
		timeout 900 debootstrap --variant=minbase --include=ca-certificates,curl bookworm "$bookworm" \
			"${DEBIAN_MIRROR:-http://deb.debian.org/debian}" >"$WORK/debootstrap.log" 2>&1 ||
			fail "debootstrap: $(tail -3 "$WORK/debootstrap.log")"
		rm -rf "$bookworm"/var/cache/apt/archives/*.deb "$bookworm"/var/lib/apt/lists/*
		touch "$bookworm/.complete"
	fi
fi
if ! have_image "$STATIC_IMAGE"; then
	MADE_BASE=1
	say "making $STATIC_IMAGE (stand-in: passwd/group with nonroot 65532, CA bundle, zoneinfo, /tmp)"
	static=$CACHE/static
	rm -rf "$static" && mkdir -p "$static"/{etc/ssl/certs,usr/share,tmp,home/nonroot,root}
	printf '%s\n' 'root:x:0:0:root:/root:/sbin/nologin' 'nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin' \
		'nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin' >"$static/etc/passwd"
	printf '%s\n' 'root:x:0:' 'nobody:x:65534:' 'tty:x:5:' 'staff:x:50:' 'nonroot:x:65532:' >"$static/etc/group"
	cp "$bookworm/etc/ssl/certs/ca-certificates.crt" "$static/etc/ssl/certs/" # Debian's bundle, as distroless
	if [ -d "$bookworm/usr/share/zoneinfo" ]; then zi=$bookworm/usr/share/zoneinfo; else zi=/usr/share/zoneinfo; fi
	cp -a "$zi" "$static/usr/share/zoneinfo"
	echo 'hosts: files dns' >"$static/etc/nsswitch.conf"
	chmod 1777 "$static/tmp" && chmod 0700 "$static/root" "$static/home/nonroot" && chown 65532:65532 "$static/home/nonroot"
	tar -C "$static" --numeric-owner -c . | $DOCKER import \
		-c 'USER 65532:65532' -c 'WORKDIR /home/nonroot' \
		-c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
		-c 'ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt' \
		-c 'LABEL org.confshim.standin=distroless-static' - "$STATIC_IMAGE" >/dev/null || fail "docker import $STATIC_IMAGE"
	rm -rf "$static"
fi
if ! have_image "$BUILDER_IMAGE"; then
	goroot=$($GO env GOROOT)
	MADE_BASE=1
	say "making $BUILDER_IMAGE (stand-in: debootstrapped bookworm + $($GO env GOVERSION) from $goroot, the machine's extra CAs)"
	cp /usr/local/share/ca-certificates/*.crt "$bookworm/usr/local/share/ca-certificates/" 2>/dev/null || true
	chroot "$bookworm" update-ca-certificates >/dev/null 2>&1 || fail "update-ca-certificates in $bookworm"
	mkdir -p "$bookworm/go/bin" "$bookworm/go/src" && chmod -R 1777 "$bookworm/go"
	# the toolchain goes in at /usr/local/go, as in the golang image
	tar --numeric-owner -c -C "$bookworm" --exclude=./.complete . \
		--transform "s,^${goroot#/},usr/local/go," -C / "${goroot#/}" |
		$DOCKER import \
			-c 'ENV PATH=/go/bin:/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
			-c 'ENV GOPATH=/go' -c 'ENV GOTOOLCHAIN=local' -c "ENV GOPROXY=$($GO env GOPROXY)" -c 'WORKDIR /go' \
			-c 'LABEL org.confshim.standin=golang' - "$BUILDER_IMAGE" >/dev/null || fail "docker import $BUILDER_IMAGE"
fi
say "bases: $BUILDER_IMAGE ($(standin "$BUILDER_IMAGE" && echo stand-in || echo real)), $STATIC_IMAGE ($(standin "$STATIC_IMAGE" && echo stand-in || echo real))"

# --- 3. the image, with the project's Dockerfile
if [ -n "$MADE_BASE" ]; then
	# the build cache of a base that was replaced is of no use, and would keep its layers
	timeout 120 $DOCKER builder prune -af >/dev/null 2>&1 || true
fi
t0=$(date +%s)
timeout 900 $DOCKER build --progress=plain --build-arg VERSION="$VERSION" -t "$IMAGE" . >"$WORK/build.log" 2>&1 ||
	fail "docker build: $(grep -E 'ERROR|error' "$WORK/build.log" | tail -5)"
say "built $IMAGE (VERSION=$VERSION) in $(($(date +%s) - t0)) s, $($DOCKER image inspect -f '{{.Size}}' "$IMAGE" | awk '{printf "%.1f MB", $1/1e6}')"
[ "$($DOCKER image inspect -f '{{.Config.User}}' "$IMAGE")" = 65532:65532 ] || fail "the image's USER is not 65532:65532"

# the stand-ins for APISIX and ADC, unless the real images are here
for pair in "apisix $APISIX_IMAGE" "adc $ADC_IMAGE"; do
	set -- $pair
	if have_image "$2" && ! standin "$2"; then
		say "using the real $2"
		continue
	fi
	DOCKER=$DOCKER BASE=$BUILDER_IMAGE GO=$GO timeout 600 tools/image-test/standin-image.sh "$1" "$2" || fail "stand-in image $2"
	TAGGED+=("$2")
done
say "stand-ins: $APISIX_IMAGE (the emulator), $ADC_IMAGE (integration/cmd/adc-server)"

# --- 4. the image on the host network
out=$($DOCKER run --rm --label "$LABEL" "$IMAGE" --help 2>&1) || fail "--help exited $?: $out"
grep -q -- '--state-dir' <<<"$out" || fail "--help does not list the flags: $out"
out=$($DOCKER run --rm --label "$LABEL" "$IMAGE" --version 2>&1) || fail "--version exited $?"
[ "$out" = "confshim $VERSION" ] || fail "--version says '$out', want 'confshim $VERSION'"
say "ok: --help exits 0, --version says '$out'"

EMU=$(free_port)
LISTEN=$(free_port)
METRICS=$(free_port)
while [ "$LISTEN" = "$EMU" ] || [ "$METRICS" = "$EMU" ] || [ "$METRICS" = "$LISTEN" ]; do METRICS=$(free_port); done
$DOCKER run -d --name "$RUN_ID-apisix" --label "$LABEL" --network host --entrypoint /usr/local/bin/apisix-standalone \
	"$APISIX_IMAGE" --listen "127.0.0.1:$EMU" --admin-key "$KEY" >/dev/null || fail "starting the emulator"
wait_for 20 "the emulator on 127.0.0.1:$EMU" curl -sf --max-time 2 -H "X-API-KEY: $KEY" "http://127.0.0.1:$EMU/apisix/admin/configs"

VOLUME=$RUN_ID-state
$DOCKER volume create --label "$LABEL" "$VOLUME" >/dev/null
start_confshim() {
	$DOCKER run -d --name "$RUN_ID-confshim" --label "$LABEL" --network host -v "$VOLUME:/var/lib/confshim" "$IMAGE" \
		--listen "127.0.0.1:$LISTEN" --metrics-listen "127.0.0.1:$METRICS" --upstream "http://127.0.0.1:$EMU" \
		--admin-key "$KEY" --state-dir /var/lib/confshim --shutdown-timeout 20s >/dev/null || fail "starting confshim"
}
start_confshim
M=http://127.0.0.1:$METRICS
P=http://127.0.0.1:$LISTEN
wait_for 20 "confshim's /healthz 200" is200 "$M/healthz"
wait_for 20 "confshim's /readyz 200" is200 "$M/readyz"
say "ok: /healthz and /readyz answer 200"

pid=$($DOCKER inspect -f '{{.State.Pid}}' "$RUN_ID-confshim")
uids=$(awk '/^Uid:/{print $2,$3,$4,$5}' "/proc/$pid/status")
gids=$(awk '/^Gid:/{print $2,$3,$4,$5}' "/proc/$pid/status")
[ "$uids" = "65532 65532 65532 65532" ] || fail "confshim (pid $pid) runs with uids $uids, want 65532"
[ "$gids" = "65532 65532 65532 65532" ] || fail "confshim (pid $pid) runs with gids $gids, want 65532"
[ "$(tr '\0' ' ' <"/proc/$pid/cmdline" | cut -d' ' -f1)" = /confshim ] || fail "pid $pid is not /confshim"
say "ok: /proc/$pid/status: uid and gid 65532"

# the README's "Try it", through the container
code=$(status "http://127.0.0.1:$EMU/apisix/admin/configs" -X PUT -H "X-API-KEY: $KEY" -H 'X-Digest: oob' \
	-d '{"secrets_conf_version":1,"secrets":[{"id":"vault/1","uri":"http://vault:8200","prefix":"kv","token":"t"}]}')
[ "$code" = 202 ] || fail "the out-of-band PUT on the emulator answered $code"
code=$(curl -s -o "$WORK/put.body" -D "$WORK/put.headers" -w '%{http_code}' --max-time 20 -X PUT -H "X-API-KEY: $KEY" \
	-H 'X-Digest: sync-1' "$P/apisix/admin/configs" \
	-d '{"routes_conf_version":1,"routes":[{"id":"r1","uris":["/get"]}],"secrets_conf_version":0}')
actions=$(sed -n 's/^X-Confshim-Actions: *//Ip' "$WORK/put.headers" | tr -d '\r')
[ "$code" = 202 ] || fail "the stale client's PUT through confshim answered $code: $(cat "$WORK/put.body")"
grep -q 'secrets=preserved' <<<"$actions" || fail "X-Confshim-Actions '$actions' lacks secrets=preserved"
last=$(curl -sf --max-time 10 "$M/debug/config" | jq -c '.last_accepted | {status, client_digest}')
[ "$last" = '{"status":202,"client_digest":"sync-1"}' ] || fail "/debug/config last_accepted: $last"
say "ok: README flow: 202, X-Confshim-Actions: $actions; /debug/config $last"

# the state file, from inside the volume
statefile=$($DOCKER run --rm --label "$LABEL" -v "$VOLUME:/v" --entrypoint stat "$BUILDER_IMAGE" -c '%a %u %g %s' /v/confshim-state.json 2>&1) ||
	fail "no state file in the volume: $statefile"
read -r mode owner group size <<<"$statefile"
[ "$mode $owner $group" = "600 65532 65532" ] || fail "state file is mode $mode owner $owner:$group, want 600 65532:65532"
grep -q '"vault/1"' < <($DOCKER run --rm --label "$LABEL" -v "$VOLUME:/v" --entrypoint cat "$BUILDER_IMAGE" /v/confshim-state.json) ||
	fail "the state file does not hold the data plane's secrets manager"
say "ok: state file in volume $VOLUME: mode $mode, owner $owner:$group, $size bytes"

# SIGTERM during a slow upload: /readyz 503 at once, the in-flight PUT answered, exit 0
{
	printf '{"routes_conf_version":2,"secrets_conf_version":0,"routes":['
	for i in $(seq 1 2470); do
		[ "$i" = 1 ] || printf ','
		printf '{"id":"route-%05d","uris":["/slow/upload/%05d"],"methods":["GET"],"desc":"sigterm drain"}' "$i" "$i"
	done
	printf ']}'
} >"$WORK/big.json"
size=$(stat -c %s "$WORK/big.json")
curl -s -o "$WORK/slow.body" -w '%{http_code}' --max-time 60 --limit-rate 100k -H 'Expect:' -X PUT -H "X-API-KEY: $KEY" \
	-H 'X-Digest: slow-1' -H 'Content-Type: application/json' --data-binary "@$WORK/big.json" "$P/apisix/admin/configs" >"$WORK/slow.code" &
curl_pid=$!
sleep 0.5
kill -0 $curl_pid 2>/dev/null || fail "the slow upload ended before SIGTERM: $(cat "$WORK/slow.code")"
t_term=$(date +%s.%N)
$DOCKER kill -s TERM "$RUN_ID-confshim" >/dev/null
wait_for 5 "/readyz 503 after SIGTERM" is503 "$M/readyz"
t_503=$(date +%s.%N)
exit_code=$(timeout 30 $DOCKER wait "$RUN_ID-confshim") || fail "confshim did not exit within 30 s of SIGTERM"
t_exit=$(date +%s.%N)
wait $curl_pid || true
slow=$(cat "$WORK/slow.code")
[ "$slow" = 202 ] || fail "the PUT in flight at SIGTERM got '$slow': $(head -c 300 "$WORK/slow.body")"
[ "$exit_code" = 0 ] || fail "confshim exited $exit_code after SIGTERM: $($DOCKER logs --tail 5 "$RUN_ID-confshim" 2>&1)"
drain=$(echo "$t_exit $t_term" | awk '{printf "%.2f", $1-$2}')
to503=$(echo "$t_503 $t_term" | awk '{printf "%.2f", $1-$2}')
awk -v d="$drain" 'BEGIN{exit !(d < 10)}' || fail "exit took $drain s after SIGTERM (the upload needs about 2.2 s)"
say "ok: SIGTERM during a $((size / 1024)) KB upload at 100 KB/s: /readyz 503 after ${to503} s, the PUT got 202, exit 0 after ${drain} s"
$DOCKER rm -f "$RUN_ID-confshim" "$RUN_ID-apisix" >/dev/null

# --- 5. deploy/compose/compose.yaml, unchanged, with the stand-ins; ports on 127.0.0.1
for p in 9080 9280 9281 3000 3001; do
	ss -Hltn "sport = :$p" | grep -q . && fail "port $p is in use here: compose.yaml publishes it"
done
cat >"$WORK/loopback.yaml" <<'EOF'
# image-test: the default network publishes on 127.0.0.1 only
version: "3.7"
networks:
  default:
    driver_opts:
      com.docker.network.bridge.host_binding_ipv4: "127.0.0.1"
EOF
CVERSION=$VERSION-compose
compose() {
	# docker-compose 1.29 builds with the CLI on PATH: Debian's, for BuildKit
	(cd deploy/compose && PATH=/usr/bin:$PATH COMPOSE_DOCKER_CLI_BUILD=1 DOCKER_BUILDKIT=1 \
		COMPOSE_PROJECT_NAME=$RUN_ID APISIX_ADMIN_KEY=$KEY CONFSHIM_VERSION=$CVERSION \
		timeout 600 docker-compose -f compose.yaml -f "$WORK/loopback.yaml" "$@")
}
CONFSHIM_COMPOSE_IMAGE=$(sed -n 's/^ *image: *\(ghcr.io\/confshim\/[^ ]*\).*/\1/p' deploy/compose/compose.yaml)
have_image "$CONFSHIM_COMPOSE_IMAGE" || TAGGED+=("$CONFSHIM_COMPOSE_IMAGE") # compose builds it: removed at the end
COMPOSE_UP=1
t0=$(date +%s)
compose up -d --build >"$WORK/compose-up.log" 2>&1 || fail "docker-compose up: $(tail -5 "$WORK/compose-up.log")"
say "compose up --build in $(($(date +%s) - t0)) s"
wait_for 60 "compose: confshim's /readyz 200 on 127.0.0.1:9281" is200 http://127.0.0.1:9281/readyz
wait_for 30 "compose: ADC's /healthz/ready on 127.0.0.1:3001" is200 http://127.0.0.1:3001/healthz/ready
for p in 9080 9280 9281 3000 3001; do
	bound=$(ss -Hltn "sport = :$p" | awk '{print $4}' | sort -u | tr '\n' ' ')
	[ "$bound" = "127.0.0.1:$p " ] || fail "compose publishes port $p on '$bound', want 127.0.0.1 only"
done
say "ok: compose publishes 9080 9280 9281 3000 3001 on 127.0.0.1 only"
bi=$(curl -sf --max-time 10 http://127.0.0.1:9281/metrics | grep '^confshim_build_info' || true)
grep -q "version=\"$CVERSION\"" <<<"$bi" || fail "the compose-built confshim reports '$bi', want version=\"$CVERSION\""
say "ok: compose-built confshim: $bi"

adc_sync() {
	curl -s -o "$WORK/sync.json" -w '%{http_code}' --max-time 30 -X PUT http://127.0.0.1:3000/sync \
		-H 'Content-Type: application/json' -d @- <<JSON
{"task": {"opts": {"backend": "apisix-standalone", "server": ["http://apisix:9280"],
                   "token": "$KEY", "cacheKey": "demo"},
          "config": {"services": [{"name": "httpbin", "upstream": {"nodes": [{"host": "httpbin.org", "port": 80, "weight": 1}]},
                                   "routes": [{"name": "get", "uris": ["/get"]}]}]}}}
JSON
}
code=$(adc_sync)
[ "$code" = 202 ] && [ "$(jq -r '.endpoint_status[0].success' "$WORK/sync.json")" = true ] ||
	fail "the README's first sync through ADC: $code $(head -c 400 "$WORK/sync.json")"
first=$(jq -r '.endpoint_status[0].response.status' "$WORK/sync.json")
compose exec -T apisix curl -s -o /dev/null -w '%{http_code}' -X PUT 127.0.0.1:9180/apisix/admin/configs \
	-H "X-API-KEY: $KEY" -H 'X-Digest: operator-1' \
	-d '{"secrets_conf_version": 1, "secrets": [{"id": "vault/1", "uri": "http://vault:8200", "prefix": "kv", "token": "t"}]}' \
	>"$WORK/oob.code" 2>"$WORK/oob.err" || fail "compose exec apisix curl: $(cat "$WORK/oob.err")"
[ "$(cat "$WORK/oob.code")" = 202 ] || fail "the operator's PUT inside apisix answered $(cat "$WORK/oob.code")"
code=$(adc_sync)
actions=$(jq -r '.endpoint_status[0].response.headers["x-confshim-actions"] // ""' "$WORK/sync.json")
[ "$code" = 202 ] && [ "$(jq -r '.endpoint_status[0].success' "$WORK/sync.json")" = true ] ||
	fail "the sync after the operator's secrets manager: $code $(head -c 400 "$WORK/sync.json")"
grep -q 'secrets=preserved' <<<"$actions" || fail "ADC's answer relays X-Confshim-Actions '$actions', lacking secrets=preserved"
say "ok: compose README: sync $first, the operator's secrets manager 202, next sync $(jq -r '.endpoint_status[0].response.status' "$WORK/sync.json") with X-Confshim-Actions: $actions"

compose down -v --remove-orphans -t 5 >"$WORK/compose-down.log" 2>&1 || fail "docker-compose down: $(tail -3 "$WORK/compose-down.log")"
COMPOSE_UP=
left=$($DOCKER ps -aq --filter "label=com.docker.compose.project=$RUN_ID")
[ -z "$left" ] || fail "compose down left containers: $left"
$DOCKER volume ls -q | grep -q "^${RUN_ID}_" && fail "compose down -v left a volume"
say "ok: compose down -v: no container, network or volume left"

# --- 6. make integration (the testcontainers tests) against this engine: the emulator's
# image where no APISIX image can be had (the stand-in tags go first: it must find none)
for t in "${TAGGED[@]}"; do
	case $t in "$APISIX_IMAGE" | "$ADC_IMAGE") $DOCKER rmi "$t" >/dev/null ;; esac
done
TAGGED+=(confshim/apisix-emulator:image-test)
t0=$(date +%s)
make --no-print-directory integration DOCKER=$DOCKER GO="$GO" EMULATOR_IMAGE=confshim/apisix-emulator:image-test >"$WORK/integration.log" 2>&1 ||
	fail "make integration: $(grep -E -- '^(--- FAIL|FAIL|SKIP|make)|_test.go:' "$WORK/integration.log" | tail -8)"
grep -q -- '--- PASS: TestContainerOutOfBandSecrets' "$WORK/integration.log" && grep -q -- '--- PASS: TestContainerLeaderChange' "$WORK/integration.log" ||
	fail "make integration ran no container test: $(tail -5 "$WORK/integration.log")"
say "ok: make integration: $(grep -c -- '^--- PASS' "$WORK/integration.log") container tests pass ($(head -1 "$WORK/integration.log" | cut -c1-60)…) in $(($(date +%s) - t0)) s"

if [ -n "$SAMPLER_PID" ]; then
	kill "$SAMPLER_PID" 2>/dev/null
	wait "$SAMPLER_PID" 2>/dev/null || true
	SAMPLER_PID=
	addrs=$(sort -u "$WORK/published" 2>/dev/null)
	[ -n "$addrs" ] || fail "the sampler saw no published port"
	wide=$(grep -v '^127\.0\.0\.1:' <<<"$addrs" || true)
	[ -z "$wide" ] || fail "the engine published ports beyond 127.0.0.1: $(tr '\n' ' ' <<<"$wide")"
	say "ok: every port the engine published in this run ($(wc -l <<<"$addrs")) was on 127.0.0.1"
fi

DISK_DOCKER=$(du -sxh /var/lib/docker 2>/dev/null | cut -f1)
DISK_CACHE=$(du -sxh "$CACHE" 2>/dev/null | cut -f1)
say "PASS in $(elapsed) s; disk: /var/lib/docker $DISK_DOCKER, $CACHE $DISK_CACHE"
