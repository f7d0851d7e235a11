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
ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
cp -R "$root/tools/image-test/standins/$kind/." "$ctx/"
(cd "$root" && CGO_ENABLED=0 ${GO:-go} build -trimpath -o "$ctx/$bin" "$pkg")
"$DOCKER" build -q --build-arg BASE="$BASE" -t "$tag" "$ctx" >/dev/null
