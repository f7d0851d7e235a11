#!/usr/bin/env bash
# standin-image.sh apisix|adc TAG: builds the stand-in image for APISIX (the emulator)
# or ADC (its server mode) from a binary built here, on BASE (default golang:1.26: sh,
# curl). DOCKER picks the CLI (default docker).
set -euo pipefail
kind=${1:?apisix or adc} tag=${2:?image tag}
root=$(cd "$(dirname "$0")/../.." && pwd)
DOCKER=${DOCKER:-docker} BASE=${BASE:-golang:1.26}
case $kind in
apisix) pkg=./integration/cmd/apisix-standalone bin=apisix-standalone ;;
adc) pkg=./integration/cmd/adc-server bin=adc-server ;;
*) echo "standin-image.sh: apisix or adc, not $kind" >&2; exit 2 ;;
esac
# the legacy builder where the CLI has no buildx (these Dockerfiles need no BuildKit)
[ -n "${DOCKER_BUILDKIT:-}" ] || "$DOCKER" buildx version >/dev/null 2>&1 || export DOCKER_BUILDKIT=0
ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
cp -R "$root/tools/image-test/standins/$kind/." "$ctx/"
(cd "$root" && CGO_ENABLED=0 ${GO:-go} build -trimpath -o "$ctx/$bin" "$pkg")
if ! "$DOCKER" build -q --build-arg BASE="$BASE" -t "$tag" "$ctx" >"$ctx/build.log" 2>&1; then
	echo "standin-image.sh: building $tag on $BASE failed:" >&2
	tail -5 "$ctx/build.log" >&2
	exit 1
fi
