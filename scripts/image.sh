#!/usr/bin/env bash
# make image: builds the fanout image with podman, reproducibly, and prints
# its id (the digest of its config). The context is made in .tmp/image:
#   - fanout: the binary, static (CGO_ENABLED=0), -trimpath, no build id or
#     VCS stamp, so the same source gives the same bytes;
#   - ca-certificates.crt: the host's bundle (Debian's ca-certificates);
#   - passwd, group: the non-root user fanout (65532).
# podman build --timestamp 0 sets every file's time and the image's creation
# time to the epoch, so the same context gives the same image id. The image
# is also written as an OCI archive (.tmp/image/fanout.oci.tar) for
# containerd (ctr images import). podman is configured by
# deploy/image/containers.conf through CONTAINERS_CONF, never /etc.
set -euo pipefail
cd "$(dirname "$0")/.."

TAG="${FANOUT_IMAGE_TAG:-localhost/fanout:dev}"
CTX=.tmp/image
if ! command -v podman >/dev/null; then
	echo "make image needs podman (Debian: apt-get install -y podman runc); .ci/run installs it" >&2
	exit 1
fi
CA=/etc/ssl/certs/ca-certificates.crt
if [[ ! -s $CA ]]; then
	echo "make image needs the CA bundle $CA (Debian: apt-get install -y ca-certificates)" >&2
	exit 1
fi

rm -rf "$CTX" && mkdir -p "$CTX"
CGO_ENABLED=0 go build -trimpath -buildvcs=false -ldflags "-s -w -buildid=" -o "$CTX/fanout" ./cmd/fanout
cp "$CA" "$CTX/ca-certificates.crt"
printf 'fanout:x:65532:65532:fanout:/:/sbin/nologin\n' > "$CTX/passwd"
printf 'fanout:x:65532:\n' > "$CTX/group"
cp deploy/image/Containerfile "$CTX/Containerfile"

export CONTAINERS_CONF="$PWD/deploy/image/containers.conf"
podman build --quiet --timestamp 0 --pull=never -t "$TAG" -f "$CTX/Containerfile" "$CTX" >/dev/null
id=$(podman image inspect --format '{{.Id}}' "$TAG")
rm -f "$CTX/fanout.oci.tar"
podman save --quiet --format oci-archive -o "$CTX/fanout.oci.tar" "$TAG"
echo "$TAG sha256:$id"
