import type { Transport } from "@connectrpc/connect";
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
export declare function createNodeTransport(opts: NodeTransportOptions): Transport;
