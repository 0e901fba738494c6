#!/usr/bin/env bash
# Builds the service's images with no registry: static binaries (CGO_ENABLED=0) built
# here for the Docker engine's OS and architecture, including natsnode (nats-server from
# its Go module at the version in go.mod, with the store guard), copied into images FROM
# scratch. Run through `make
# images`; IMAGE_TAG (default dev) tags them.
#
# Needs Go (the version in go.mod) and the modules in the module cache: on an air-gapped
# host, run `go mod download` once while connected, or copy a module cache over.
set -euo pipefail
cd "$(dirname "$0")/.."

out=deployments/build
tag="${IMAGE_TAG:-dev}"
rm -rf "$out"
mkdir -p "$out"

export CGO_ENABLED=0 GOOS=linux
GOARCH=$(docker version -f '{{.Server.Arch}}')
export GOARCH
flags=(-trimpath -ldflags=-s\ -w)
echo "building static binaries into $out/"
go build "${flags[@]}" -o "$out/" ./cmd/ingest ./cmd/dispatcher ./cmd/dispatchctl ./cmd/demoraven ./cmd/healthcheck ./cmd/natsnode
nats_version=$(go list -m -f '{{.Version}}' github.com/nats-io/nats-server/v2)

# CA roots for TLS to raven or NATS, from the host (Debian/Ubuntu, Fedora/RHEL, Alpine,
# macOS), or CA_BUNDLE.
bundle="${CA_BUNDLE:-}"
for f in /etc/ssl/certs/ca-certificates.crt /etc/pki/tls/certs/ca-bundle.crt /etc/ssl/cert.pem; do
  [ -z "$bundle" ] && [ -f "$f" ] && bundle=$f
done
if [ -n "$bundle" ]; then
  cp "$bundle" "$out/ca-certificates.crt"
elif [ "${ALLOW_NO_CA:-}" = 1 ]; then
  echo "no CA bundle found: the images will trust no CA (TLS to raven or NATS will fail)" >&2
  : > "$out/ca-certificates.crt"
else
  echo "no CA bundle found: set CA_BUNDLE=<file>, or ALLOW_NO_CA=1 for images that trust no CA" >&2
  exit 1
fi
mkdir -p "$out/data" # the data directory, owned by the unprivileged user in the images

build() { # image version
  local log
  if ! log=$(docker build -f deployments/Dockerfile --build-arg "APP=$1" \
      --label "org.opencontainers.image.version=$2" -t "penguin-dispatch/$1:$tag" "$out" 2>&1); then
    echo "$log" >&2
    exit 1
  fi
  echo "built penguin-dispatch/$1:$tag ($GOOS/$GOARCH)"
}
build ingest "$tag"
build dispatcher "$tag"
build demoraven "$tag"
build natsnode "$nats_version"

# The compose file's optional "monitoring" profile: Prometheus with the scrape
# configuration and alert rules of deployments/prometheus. No registry to pull it from, and
# building Prometheus from source needs its web assets and much of the Go ecosystem: the
# image takes the host's prometheus binary (the distribution's package: apt-get install
# prometheus; or PROMETHEUS_BIN) and the shared libraries it loads, FROM scratch. Without
# one the profile's image is not built, and this says so.
prom="${PROMETHEUS_BIN:-$(command -v prometheus || true)}"
if [ -z "$prom" ]; then
  echo "no prometheus binary here (apt-get install prometheus, or PROMETHEUS_BIN=...): the monitoring profile's image is not built"
  exit 0
fi
pdir="$out/prometheus"
mkdir -p "$pdir/rootfs/bin" "$pdir/rootfs/etc/prometheus" "$pdir/data"
cp "$prom" "$pdir/rootfs/bin/prometheus"
for lib in $(ldd "$prom" 2>/dev/null | grep -o '/[^ ]*' || true); do # at the paths it loads them from
  mkdir -p "$pdir/rootfs$(dirname "$lib")"
  cp -L "$lib" "$pdir/rootfs$lib"
done
cp deployments/prometheus/prometheus.yml deployments/prometheus/rules.yml "$pdir/rootfs/etc/prometheus/"
prom_version=$("$prom" --version 2>&1 | head -1 | awk '{print $3}')
if ! log=$(docker build -f deployments/Dockerfile.prometheus --label "org.opencontainers.image.version=$prom_version" \
    -t "penguin-dispatch/prometheus:$tag" "$pdir" 2>&1); then
  echo "$log" >&2
  exit 1
fi
echo "built penguin-dispatch/prometheus:$tag (prometheus $prom_version from $prom)"
