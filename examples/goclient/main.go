// Command goclient shows how a Go service calls fanout: it sends one run,
// streams its events, and prints the joined facts.
//
//	go run ./examples/goclient -addr 127.0.0.1:50051
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:50051", "orchestrator address")
	flag.Parse()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// An API key from `fanout key create`, sent on every call as
	// `authorization: Bearer <key>` (the tenant is the key's). `fanout dev`
	// runs with --auth none and needs none. Over anything but loopback use
	// TLS: grpc.WithTransportCredentials(credentials.NewClientTLSFromFile(ca, "")).
	opts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	if key := os.Getenv("FANOUT_API_KEY"); key != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(bearer(key)))
	}
	conn, err := grpc.NewClient(*addr, opts...)
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	client := fanoutv1.NewOrchestratorServiceClient(conn)

	spec := &fanoutv1.RunSpec{
		// The same key always means the same run: retrying this call after a
		// network error never starts (or pays for) a second one.
		IdempotencyKey: fmt.Sprintf("goclient-%d", time.Now().Unix()),
		Goal:           "Compare three vector databases for a 10M-embedding workload",
		Budget:         &fanoutv1.Budget{LimitTokens: 8000},
		Limits:         &fanoutv1.Limits{MaxConcurrency: 3, RunTimeout: durationpb.New(time.Minute)},
		JoinPolicy:     fanoutv1.JoinPolicy_JOIN_POLICY_ALL_SETTLED,
	}
	for _, id := range []string{"pgvector", "qdrant", "milvus"} {
		spec.Tasks = append(spec.Tasks, &fanoutv1.TaskSpec{
			Id:           id,
			Instruction:  "Find recall@10 and p99 query latency published for " + id,
			TokenBudget:  3000,
			AllowedTools: []string{"search", "fetch"},
		})
	}

	// Run streams events until the run ends; cancelling ctx cancels the run.
	stream, err := client.Run(ctx, &fanoutv1.RunRequest{Spec: spec})
	if err != nil {
		log.Fatal(status.Convert(err).Message())
	}
	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			log.Fatal(status.Convert(err).Message())
		}
		switch ev := resp.GetEvent().GetEvent().(type) {
		case *fanoutv1.RunEvent_TaskFinished:
			o := ev.TaskFinished.GetOutcome()
			fmt.Printf("%-10s %s, %d tokens\n", o.GetTaskId(), o.GetStatus(), o.GetTokensSpent())
		case *fanoutv1.RunEvent_RunFinished:
			res := ev.RunFinished.GetResult()
			fmt.Printf("run %s: %s, %d tokens\n", resp.GetEvent().GetRunId(), ev.RunFinished.GetState(), res.GetTotalTokens())
			facts := res.GetFacts()
			// A large run's result holds its first facts (each message stays
			// under 2 MiB): the rest are ListRunFacts' pages.
			for token := res.GetFactsNextPageToken(); token != ""; {
				page, err := client.ListRunFacts(ctx, &fanoutv1.ListRunFactsRequest{RunId: resp.GetEvent().GetRunId(),
					PageSize: 1000, PageToken: token})
				if err != nil {
					log.Fatal(status.Convert(err).Message())
				}
				facts, token = append(facts, page.GetFacts()...), page.GetNextPageToken()
			}
			for _, f := range facts {
				fmt.Printf("  - %s %v\n", f.GetText(), f.GetSources())
			}
		}
	}
}

// bearer is an API key as gRPC per-call credentials.
type bearer string

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}

// RequireTransportSecurity is false so that the example also runs against
// a loopback orchestrator without TLS; never send a key in plaintext
// beyond loopback.
func (bearer) RequireTransportSecurity() bool { return false }
