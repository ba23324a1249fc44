// Typed errors: every failed call of the client throws a FanoutError (or
// one of its subclasses), made from the ConnectError the transport raised,
// with the server's google.rpc details decoded.
import { Code, ConnectError } from "@connectrpc/connect";
import { BadRequestSchema, ErrorInfoSchema, QuotaFailureSchema, } from "./gen/google/rpc/error_details_pb.js";
const codeNames = {
    [Code.Canceled]: "CANCELLED",
    [Code.Unknown]: "UNKNOWN",
    [Code.InvalidArgument]: "INVALID_ARGUMENT",
    [Code.DeadlineExceeded]: "DEADLINE_EXCEEDED",
    [Code.NotFound]: "NOT_FOUND",
    [Code.AlreadyExists]: "ALREADY_EXISTS",
    [Code.PermissionDenied]: "PERMISSION_DENIED",
    [Code.ResourceExhausted]: "RESOURCE_EXHAUSTED",
    [Code.FailedPrecondition]: "FAILED_PRECONDITION",
    [Code.Aborted]: "ABORTED",
    [Code.OutOfRange]: "OUT_OF_RANGE",
    [Code.Unimplemented]: "UNIMPLEMENTED",
    [Code.Internal]: "INTERNAL",
    [Code.Unavailable]: "UNAVAILABLE",
    [Code.DataLoss]: "DATA_LOSS",
    [Code.Unauthenticated]: "UNAUTHENTICATED",
};
/**
 * FanoutError is the error every call of the client throws. code names the
 * gRPC status; fieldViolations name the wrong fields of an INVALID_ARGUMENT
 * (empty otherwise). Its message never holds the API key.
 */
export class FanoutError extends Error {
    name = "FanoutError";
    /** The status code's name: "INVALID_ARGUMENT". */
    code;
    /** The server's message, or the client's for an error it made itself. */
    rawMessage;
    /** The wrong fields (google.rpc.BadRequest), empty when the server named none. */
    fieldViolations;
    /** The quotas passed (google.rpc.QuotaFailure), for RESOURCE_EXHAUSTED. */
    quotaViolations;
    /** The error's reason (google.rpc.ErrorInfo), if the server sent one. */
    reason;
    constructor(code, message, details = {}) {
        super(`${code}: ${message}`, details.cause === undefined ? undefined : { cause: details.cause });
        this.code = code;
        this.rawMessage = message;
        this.fieldViolations = details.fieldViolations ?? [];
        this.quotaViolations = details.quotaViolations ?? [];
        this.reason = details.reason;
    }
}
/** InvalidArgumentError: a malformed request; fieldViolations name the fields. */
export class InvalidArgumentError extends FanoutError {
    name = "InvalidArgumentError";
}
/** UnauthenticatedError: no key, or a key unknown, revoked or expired. */
export class UnauthenticatedError extends FanoutError {
    name = "UnauthenticatedError";
}
/** PermissionDeniedError: the key lacks the call's scope. */
export class PermissionDeniedError extends FanoutError {
    name = "PermissionDeniedError";
}
/** NotFoundError: an unknown run or call id (or another tenant's). */
export class NotFoundError extends FanoutError {
    name = "NotFoundError";
}
/** ResourceExhaustedError: a cap, a rate or a budget passed; quotaViolations say which. */
export class ResourceExhaustedError extends FanoutError {
    name = "ResourceExhaustedError";
}
/** DeadlineExceededError: the call's timeoutMs passed. */
export class DeadlineExceededError extends FanoutError {
    name = "DeadlineExceededError";
}
/** UnavailableError: the server could not be reached, or the connection dropped. */
export class UnavailableError extends FanoutError {
    name = "UnavailableError";
}
/** FailedPreconditionError: the call does not fit the run's state (a reused key with another spec, an ended run). */
export class FailedPreconditionError extends FanoutError {
    name = "FailedPreconditionError";
}
const subclasses = {
    INVALID_ARGUMENT: InvalidArgumentError,
    UNAUTHENTICATED: UnauthenticatedError,
    PERMISSION_DENIED: PermissionDeniedError,
    NOT_FOUND: NotFoundError,
    RESOURCE_EXHAUSTED: ResourceExhaustedError,
    DEADLINE_EXCEEDED: DeadlineExceededError,
    UNAVAILABLE: UnavailableError,
    FAILED_PRECONDITION: FailedPreconditionError,
};
/** newFanoutError makes the error of code, of its subclass when it has one. */
export function newFanoutError(code, message, details) {
    const Class = subclasses[code] ?? FanoutError;
    return new Class(code, message, details);
}
/**
 * fromConnectError turns whatever a call threw into a FanoutError. A
 * connection the client lost (fetch failed, a socket reset, a stream cut
 * before its end: connect-web calls these UNKNOWN, connect-node ABORTED or
 * INTERNAL) is UNAVAILABLE, as gRPC calls it, so that one code means "the
 * network, try again". An error the server sent keeps its code, whatever
 * its text. Each secret is cut out of every string of the error (message,
 * violations, ErrorInfo), in case a proxy echoed a header.
 */
export function fromConnectError(err, secrets = []) {
    if (err instanceof FanoutError)
        return err;
    const e = ConnectError.from(err);
    let code = codeNames[e.code] ?? "UNKNOWN";
    const lost = connectionLost(e);
    if (lost)
        code = "UNAVAILABLE";
    const redact = (s) => secrets.reduce((m, k) => (k ? m.split(k).join("[redacted]") : m), s);
    const fieldViolations = e.findDetails(BadRequestSchema).flatMap((d) => d.fieldViolations.map((v) => ({ field: redact(v.field), description: redact(v.description) })));
    const quotaViolations = e.findDetails(QuotaFailureSchema).flatMap((d) => d.violations.map((v) => ({ subject: redact(v.subject), description: redact(v.description) })));
    const info = e.findDetails(ErrorInfoSchema)[0];
    const reason = info && {
        reason: redact(info.reason),
        domain: redact(info.domain),
        metadata: Object.fromEntries(Object.entries(info.metadata).map(([k, v]) => [redact(k), redact(v)])),
    };
    // The ConnectError is not kept as the cause: its message is unredacted.
    const fe = newFanoutError(code, redact(e.rawMessage), { fieldViolations, quotaViolations, ...(reason ? { reason } : {}) });
    if (lost || streamReset(e))
        dropped.add(fe);
    return fe;
}
// dropped holds the errors fromConnectError made of a lost connection.
const dropped = new WeakSet();
/**
 * isDroppedConnection reports whether e is the client's own failure to
 * reach the server or keep its connection (UNAVAILABLE), or an HTTP/2
 * stream reset under an open call (INTERNAL): a call that may be made
 * again. False for any error the server sent, INTERNAL included.
 */
export function isDroppedConnection(e) {
    return dropped.has(e);
}
// SOCKET_CODES are the codes of Node's and undici's errors of a connection
// that could not be made or was lost.
const SOCKET_CODES = new Set([
    "ECONNRESET",
    "ECONNREFUSED",
    "ECONNABORTED",
    "EPIPE",
    "ETIMEDOUT",
    "EHOSTUNREACH",
    "ENETUNREACH",
    "ENETDOWN",
    "ENOTFOUND",
    "EAI_AGAIN",
    "UND_ERR_SOCKET",
    "UND_ERR_CLOSED",
    "UND_ERR_CONNECT_TIMEOUT",
    "ERR_HTTP2_SESSION_ERROR",
    "ERR_HTTP2_GOAWAY_SESSION",
    "ERR_HTTP2_INVALID_SESSION",
    "ERR_STREAM_PREMATURE_CLOSE",
]);
// connectionLost reports whether e is the client's own network failure,
// found in its cause chain, which an error read from the server has none
// of: fetch's TypeError ("fetch failed", "terminated"), an error with a
// socket code (SOCKET_CODES), or connect-web's stream that ended without
// its end-of-stream message (thrown as that string). A TypeError of any
// other text (an invalid header) is not the network.
function connectionLost(e) {
    if (e.cause === "missing EndStreamResponse")
        return true;
    const seen = new Set();
    for (let c = e.cause; c instanceof Error && !seen.has(c); c = c.cause) {
        seen.add(c);
        if (c instanceof TypeError && (c.message === "fetch failed" || c.message === "terminated"))
            return true;
        const code = c.code;
        if (typeof code === "string" && SOCKET_CODES.has(code))
            return true;
    }
    return false;
}
// streamReset reports whether e is connect-node's own error of an HTTP/2
// stream reset with a code that means the stream broke, not the call's
// answer (connect-node's node-error.js writes this message).
function streamReset(e) {
    return (e.code === Code.Internal &&
        /^http\/2 stream closed with error code (INTERNAL_ERROR|PROTOCOL_ERROR|FLOW_CONTROL_ERROR|CONNECT_ERROR) /.test(e.rawMessage));
}
