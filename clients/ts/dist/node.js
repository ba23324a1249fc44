// @fanout/client/node: transports for Node.js only (connect-node), for what
// fetch cannot do: trust a CA of your own (a private TLS deployment), or
// speak gRPC to the orchestrator's gRPC listener.
import { readFileSync } from "node:fs";
import { createConnectTransport, createGrpcTransport } from "@connectrpc/connect-node";
/**
 * createNodeTransport makes a transport for createFanoutClient's transport
 * option. Throws a TypeError for gRPC over HTTP/1.1, which gRPC cannot use.
 */
export function createNodeTransport(opts) {
    const ca = opts.ca ?? (opts.caFile === undefined ? undefined : readFileSync(opts.caFile));
    const tls = ca === undefined ? {} : { ca };
    if (opts.protocol === "grpc") {
        if (opts.httpVersion === "1.1")
            throw new TypeError("createNodeTransport: gRPC needs httpVersion 2");
        return createGrpcTransport({ baseUrl: opts.baseUrl, nodeOptions: tls });
    }
    if (opts.httpVersion === "2") {
        return createConnectTransport({ baseUrl: opts.baseUrl, httpVersion: "2", nodeOptions: tls });
    }
    return createConnectTransport({ baseUrl: opts.baseUrl, httpVersion: "1.1", nodeOptions: tls });
}
