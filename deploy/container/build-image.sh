#!/usr/bin/env bash
# Builds pruneserve's container image where no image registry is reachable: a
# Debian bookworm root filesystem made by mmdebstrap from Debian's mirror, imported
# as the base image, then deploy/container/Dockerfile built on it with buildah.
# Usage: deploy/container/build-image.sh [TAG]     (default localhost/pruneserve:latest)
# Needs root (or a rootless podman set-up) and: apt-get install mmdebstrap buildah podman
set -euo pipefail
cd "$(dirname "$0")/../.."
TAG=${1:-localhost/pruneserve:latest}
BASE=localhost/pruneserve-base:bookworm
MIRROR=${PS_DEBIAN_MIRROR:-http://deb.debian.org/debian}
for tool in mmdebstrap buildah podman; do
  command -v "$tool" >/dev/null || { echo "build-image: $tool is missing (apt-get install mmdebstrap buildah podman)" >&2; exit 2; }
done
if ! podman image exists "$BASE"; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  echo "build-image: making the base image $BASE with mmdebstrap ($MIRROR)"
  mmdebstrap --quiet --variant=minbase --include=ca-certificates bookworm "$tmp/rootfs.tar" "$MIRROR"
  podman import --quiet "$tmp/rootfs.tar" "$BASE" >/dev/null
fi
echo "build-image: building $TAG"
buildah bud --quiet --layers --format docker --isolation chroot --network host --build-arg BASE="$BASE" -f deploy/container/Dockerfile \
  -t "$TAG" .
echo "build-image: $TAG ($(podman image inspect --format '{{.Size}}' "$TAG" | numfmt --to=iec) bytes)"
