// @fanout/client/node: transports for Node.js only (connect-node), for what
// fetch cannot do: trust a CA of your own (a private TLS deployment), or
// speak gRPC to the orchestrator's gRPC listener.

import { readFileSync } from "node:fs";
import type { Transport } from "@connectrpc/connect";
import { createConnectTransport, createGrpcTransport } from "@connectrpc/connect-node";

/** NodeTransportOptions configure createNodeTransport. */
export interface NodeTransportOptions {
  /**
   * The orchestrator: its HTTP listener for Connect ("https://127.0.0.1:8443"),
   * its gRPC listener for gRPC ("https://127.0.0.1:50051", or http:// for
   * plaintext h2c).
   */
  baseUrl: string;
  /** PEM of the CA(s) to trust for TLS, in place of Node's default roots. */
  ca?: string | Buffer | Array<string | Buffer>;
  /** Path of a PEM file of the CA(s) to trust (read once, now). */
  caFile?: string;
  /** "connect" (default) or "grpc" (which needs HTTP/2). */
  protocol?: "connect" | "grpc";
  /** "1.1" (the default for Connect) or "2" (always for gRPC). */
  httpVersion?: "1.1" | "2";
}

/**
 * createNodeTransport makes a transport for createFanoutClient's transport
 * option. Throws a TypeError for gRPC over HTTP/1.1, which gRPC cannot use.
 */
export function createNodeTransport(opts: NodeTransportOptions): Transport {
  const ca = opts.ca ?? (opts.caFile === undefined ? undefined : readFileSync(opts.caFile));
  const tls = ca === undefined ? {} : { ca };
  if (opts.protocol === "grpc") {
    if (opts.httpVersion === "1.1") throw new TypeError("createNodeTransport: gRPC needs httpVersion 2");
    return createGrpcTransport({ baseUrl: opts.baseUrl, nodeOptions: tls });
  }
  if (opts.httpVersion === "2") {
    return createConnectTransport({ baseUrl: opts.baseUrl, httpVersion: "2", nodeOptions: tls });
  }
  return createConnectTransport({ baseUrl: opts.baseUrl, httpVersion: "1.1", nodeOptions: tls });
}
