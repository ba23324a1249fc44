//go:build tools

// Package tools pins the Kubernetes binaries the chart's cluster tests run: the control
// plane and kubelet from k8s.io/kubernetes, and kwok's fake nodes.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubelet"
	_ "sigs.k8s.io/kwok/cmd/kwok"
)
