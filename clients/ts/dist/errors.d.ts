/** FanoutErrorCode is a gRPC status code's name, as gRPC spells it: "INVALID_ARGUMENT". */
export type FanoutErrorCode = "CANCELLED" | "UNKNOWN" | "INVALID_ARGUMENT" | "DEADLINE_EXCEEDED" | "NOT_FOUND" | "ALREADY_EXISTS" | "PERMISSION_DENIED" | "RESOURCE_EXHAUSTED" | "FAILED_PRECONDITION" | "ABORTED" | "OUT_OF_RANGE" | "UNIMPLEMENTED" | "INTERNAL" | "UNAVAILABLE" | "DATA_LOSS" | "UNAUTHENTICATED";
/** FieldViolation is one wrong field of a request (google.rpc.BadRequest): field is the proto's path, "spec.tasks[0].token_budget". */
export interface FieldViolation {
    field: string;
    description: string;
}
/** QuotaViolation is one quota a call passed (google.rpc.QuotaFailure). */
export interface QuotaViolation {
    subject: string;
    description: string;
}
/** ErrorReason is a google.rpc.ErrorInfo: WatchRun's WATCH_READER_BEHIND, with metadata.after_sequence. */
export interface ErrorReason {
    reason: string;
    domain: string;
    metadata: Record<string, string>;
}
/**
 * FanoutError is the error every call of the client throws. code names the
 * gRPC status; fieldViolations name the wrong fields of an INVALID_ARGUMENT
 * (empty otherwise). Its message never holds the API key.
 */
export declare class FanoutError extends Error {
    name: string;
    /** The status code's name: "INVALID_ARGUMENT". */
    readonly code: FanoutErrorCode;
    /** The server's message, or the client's for an error it made itself. */
    readonly rawMessage: string;
    /** The wrong fields (google.rpc.BadRequest), empty when the server named none. */
    readonly fieldViolations: FieldViolation[];
    /** The quotas passed (google.rpc.QuotaFailure), for RESOURCE_EXHAUSTED. */
    readonly quotaViolations: QuotaViolation[];
    /** The error's reason (google.rpc.ErrorInfo), if the server sent one. */
    readonly reason: ErrorReason | undefined;
    constructor(code: FanoutErrorCode, message: string, details?: {
        fieldViolations?: FieldViolation[];
        quotaViolations?: QuotaViolation[];
        reason?: ErrorReason;
        cause?: unknown;
    });
}
/** InvalidArgumentError: a malformed request; fieldViolations name the fields. */
export declare class InvalidArgumentError extends FanoutError {
    name: string;
}
/** UnauthenticatedError: no key, or a key unknown, revoked or expired. */
export declare class UnauthenticatedError extends FanoutError {
    name: string;
}
/** PermissionDeniedError: the key lacks the call's scope. */
export declare class PermissionDeniedError extends FanoutError {
    name: string;
}
/** NotFoundError: an unknown run or call id (or another tenant's). */
export declare class NotFoundError extends FanoutError {
    name: string;
}
/** ResourceExhaustedError: a cap, a rate or a budget passed; quotaViolations say which. */
export declare class ResourceExhaustedError extends FanoutError {
    name: string;
}
/** DeadlineExceededError: the call's timeoutMs passed. */
export declare class DeadlineExceededError extends FanoutError {
    name: string;
}
/** UnavailableError: the server could not be reached, or the connection dropped. */
export declare class UnavailableError extends FanoutError {
    name: string;
}
/** FailedPreconditionError: the call does not fit the run's state (a reused key with another spec, an ended run). */
export declare class FailedPreconditionError extends FanoutError {
    name: string;
}
/** newFanoutError makes the error of code, of its subclass when it has one. */
export declare function newFanoutError(code: FanoutErrorCode, message: string, details?: ConstructorParameters<typeof FanoutError>[2]): FanoutError;
/**
 * fromConnectError turns whatever a call threw into a FanoutError. A
 * connection the client lost (fetch failed, a socket reset, a stream cut
 * before its end: connect-web calls these UNKNOWN, connect-node ABORTED or
 * INTERNAL) is UNAVAILABLE, as gRPC calls it, so that one code means "the
 * network, try again". An error the server sent keeps its code, whatever
 * its text. Each secret is cut out of every string of the error (message,
 * violations, ErrorInfo), in case a proxy echoed a header.
 */
export declare function fromConnectError(err: unknown, secrets?: readonly string[]): FanoutError;
/**
 * isDroppedConnection reports whether e is the client's own failure to
 * reach the server or keep its connection (UNAVAILABLE), or an HTTP/2
 * stream reset under an open call (INTERNAL): a call that may be made
 * again. False for any error the server sent, INTERNAL included.
 */
export declare function isDroppedConnection(e: FanoutError): boolean;
