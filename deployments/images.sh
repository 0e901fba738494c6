#!/usr/bin/env bash
# Builds the service's images with no registry: static binaries (CGO_ENABLED=0) built
# here, including nats-server from its Go module at the version in go.mod, copied into
# images FROM scratch. Run through `make images`; IMAGE_TAG (default dev) tags them.
set -euo pipefail
cd "$(dirname "$0")/.."

out=deployments/build
tag="${IMAGE_TAG:-dev}"
rm -rf "$out"
mkdir -p "$out"

export CGO_ENABLED=0
flags=(-trimpath -ldflags=-s\ -w)
echo "building static binaries into $out/"
go build "${flags[@]}" -o "$out/" ./cmd/ingest ./cmd/dispatcher ./cmd/dispatchctl ./cmd/demoraven ./cmd/healthcheck
nats_version=$(go list -m -f '{{.Version}}' github.com/nats-io/nats-server/v2)
go build "${flags[@]}" -o "$out/" github.com/nats-io/nats-server/v2

# CA roots for TLS to raven or NATS; an empty file when the host has none.
if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
  cp /etc/ssl/certs/ca-certificates.crt "$out/"
else
  echo "no /etc/ssl/certs/ca-certificates.crt here: the images will trust no CA" >&2
  : > "$out/ca-certificates.crt"
fi

build() { # image app user version
  local log
  if ! log=$(docker build -f deployments/Dockerfile --build-arg "APP=$2" --build-arg "RUN_AS=$3" \
      --label "org.opencontainers.image.version=$4" -t "penguin-dispatch/$1:$tag" "$out" 2>&1); then
    echo "$log" >&2
    exit 1
  fi
  echo "built penguin-dispatch/$1:$tag"
}
build ingest ingest 65534:65534 "$tag"
build dispatcher dispatcher 65534:65534 "$tag"
build demoraven demoraven 65534:65534 "$tag"
# nats-server writes JetStream data to a volume created owned by root.
build nats-server nats-server 0:0 "$nats_version"
