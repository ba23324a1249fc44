package tenant_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/fanout/fanout/tenant"
)

// TestPresentedSecretIsNotPrinted: a context carrying a presented secret,
// printed as a log line or a panic would, shows nothing of it (issue 40's
// review), and PresentedSecret still returns it.
func TestPresentedSecretIsNotPrinted(t *testing.T) {
	ctx := tenant.WithPresentedSecret(context.Background(), "s3cr3t-value")
	for _, out := range []string{fmt.Sprint(ctx), fmt.Sprintf("%v %+v %#v", ctx, ctx, ctx)} {
		if strings.Contains(out, "s3cr3t") {
			t.Errorf("a printed context shows the secret: %s", out)
		}
	}
	if s, ok := tenant.PresentedSecret(ctx); !ok || s != "s3cr3t-value" {
		t.Errorf("PresentedSecret = %q, %v", s, ok)
	}
	if _, ok := tenant.PresentedSecret(context.Background()); ok {
		t.Error("PresentedSecret without one: ok")
	}
}
