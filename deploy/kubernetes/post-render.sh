#!/usr/bin/env bash
# Helm post-renderer: helm install apisix apisix/apisix -n ingress-apisix -f values.yaml \
#   --post-renderer deploy/kubernetes/post-render.sh
# Reads the chart's rendering on stdin, applies this overlay, writes the result.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp "$here"/kustomization.yaml "$here"/confshim-sidecar.yaml "$here"/admin-service.yaml "$work"/
cat > "$work"/apisix-rendered.yaml
kubectl kustomize "$work"
