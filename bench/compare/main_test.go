package main

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestSmokeIsOneRunOfTenPerSide(t *testing.T) {
	c, err := parseConfig([]string{"-smoke"})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(c.sizes, []int{smokeN}) || !slices.Equal(c.reps, []int{1}) || c.warmup != 0 || c.total != 3*time.Minute {
		t.Errorf("-smoke: sizes %v, reps %v, warmup %d, timeout %v; want [%d] [1] 0 3m", c.sizes, c.reps, c.warmup, c.total, smokeN)
	}
	if c, err := parseConfig([]string{"-smoke", "-timeout", "1m"}); err != nil || c.total != time.Minute {
		t.Errorf("-smoke -timeout 1m: %v, %v", c.total, err)
	}
	for _, flag := range []string{"-n", "-reps", "-warmup"} {
		if _, err := parseConfig([]string{"-smoke", flag, "1"}); err == nil || !strings.Contains(err.Error(), "-smoke") {
			t.Errorf("-smoke %s 1: %v, want an error naming -smoke", flag, err)
		}
	}
}

func TestDefaultsMeasureAfterOneWarmUp(t *testing.T) {
	c, err := parseConfig(nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.smoke || !slices.Equal(c.sizes, []int{10, 100, 1000}) || !slices.Equal(c.reps, []int{5, 5, 5}) || c.warmup != 1 {
		t.Errorf("defaults: smoke %v, sizes %v, reps %v, warmup %d", c.smoke, c.sizes, c.reps, c.warmup)
	}
	if _, err := parseConfig([]string{"-warmup", "-1"}); err == nil {
		t.Error("-warmup -1 accepted")
	}
}

func TestRefusedRunsSaySo(t *testing.T) {
	for _, code := range []codes.Code{codes.Unauthenticated, codes.PermissionDenied} {
		err := refused("run 10 tasks", status.Error(code, "no"))
		if !strings.Contains(err.Error(), "REFUSED") || status.Code(errors.Unwrap(err)) != code {
			t.Errorf("%v: %v", code, err)
		}
	}
	if err := refused("run 10 tasks", status.Error(codes.Unavailable, "down")); strings.Contains(err.Error(), "REFUSED") {
		t.Errorf("Unavailable: %v", err)
	}
}
