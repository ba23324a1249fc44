package pglocal_test

import (
	"context"
	"fmt"
	"log"

	"github.com/fanout/fanout/store/pglocal"
)

func ExampleStart() {
	ctx := context.Background()
	srv, err := pglocal.Start(ctx, pglocal.Config{DataDir: ".tmp/pg/data"})
	if err != nil {
		log.Fatal(err) // Wraps pglocal.ErrNoBinaries if PostgreSQL is not installed.
	}
	defer func() { _ = srv.Stop(ctx) }()
	fmt.Println(srv.URL("postgres"))
}
