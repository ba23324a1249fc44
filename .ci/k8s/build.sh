#!/usr/bin/env bash
# Builds the Kubernetes binaries the chart's cluster tests run (kube-apiserver,
# kube-controller-manager, kube-scheduler, kubelet from k8s.io/kubernetes,
# kwok from sigs.k8s.io/kwok) from the Go module proxy, once per machine, into
# a cache outside the repo keyed by version, this module's go.mod, go.sum and
# tools.go, and the Go version:
#   ${FANOUT_K8S_CACHE:-~/.cache/fanout-k8s}/v1.37.2-<hash>/
# Prints that directory. Cold: 16 min on 2 cores (1,550 CPU-s user, 410 s
# system; 600 MB of modules, 3.9 GB of build cache; 2.4 GB peak memory, the
# API server); warm: nothing. Nothing is downloaded but module source.
set -euo pipefail
cd "$(dirname "$0")"
V=$(go list -m -f '{{.Version}}' k8s.io/kubernetes)
SUM=$( (cat go.mod go.sum tools.go; go env GOVERSION) | sha256sum | cut -c1-12)
OUT="${FANOUT_K8S_CACHE:-${HOME:-/root}/.cache/fanout-k8s}/$V-$SUM"
BINS=(kube-apiserver kube-controller-manager kube-scheduler kubelet kwok)
missing=()
for b in "${BINS[@]}"; do [[ -x $OUT/$b ]] || missing+=("$b"); done
if ((${#missing[@]})); then
	echo "building ${missing[*]} into $OUT (once per machine)" >&2
	mkdir -p "$OUT.tmp"
	pkgs=()
	for b in "${missing[@]}"; do
		case $b in
		kwok) pkgs+=(sigs.k8s.io/kwok/cmd/kwok) ;;
		*) pkgs+=("k8s.io/kubernetes/cmd/$b") ;;
		esac
	done
	LD="-s -w -X k8s.io/component-base/version.gitVersion=$V -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=37"
	# one package at a time: the API server alone peaks at 2.4 GB
	for p in "${pkgs[@]}"; do
		CGO_ENABLED=0 go build -trimpath -ldflags "$LD" -o "$OUT.tmp/" "$p" >&2
	done
	mkdir -p "$OUT"
	for b in "${missing[@]}"; do mv "$OUT.tmp/$b" "$OUT/$b"; done
	rmdir "$OUT.tmp"
fi
echo "$OUT"
