// Typed errors: every failed call of the client throws a FanoutError (or
// one of its subclasses), made from the ConnectError the transport raised,
// with the server's google.rpc details decoded.

import { Code, ConnectError } from "@connectrpc/connect";
import {
  BadRequestSchema,
  ErrorInfoSchema,
  QuotaFailureSchema,
} from "./gen/google/rpc/error_details_pb.js";

/** FanoutErrorCode is a gRPC status code's name, as gRPC spells it: "INVALID_ARGUMENT". */
export type FanoutErrorCode =
  | "CANCELLED"
  | "UNKNOWN"
  | "INVALID_ARGUMENT"
  | "DEADLINE_EXCEEDED"
  | "NOT_FOUND"
  | "ALREADY_EXISTS"
  | "PERMISSION_DENIED"
  | "RESOURCE_EXHAUSTED"
  | "FAILED_PRECONDITION"
  | "ABORTED"
  | "OUT_OF_RANGE"
  | "UNIMPLEMENTED"
  | "INTERNAL"
  | "UNAVAILABLE"
  | "DATA_LOSS"
  | "UNAUTHENTICATED";

const codeNames: Record<Code, FanoutErrorCode> = {
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
export class FanoutError extends Error {
  override name = "FanoutError";
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

  constructor(
    code: FanoutErrorCode,
    message: string,
    details: {
      fieldViolations?: FieldViolation[];
      quotaViolations?: QuotaViolation[];
      reason?: ErrorReason;
      cause?: unknown;
    } = {},
  ) {
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
  override name = "InvalidArgumentError";
}
/** UnauthenticatedError: no key, or a key unknown, revoked or expired. */
export class UnauthenticatedError extends FanoutError {
  override name = "UnauthenticatedError";
}
/** PermissionDeniedError: the key lacks the call's scope. */
export class PermissionDeniedError extends FanoutError {
  override name = "PermissionDeniedError";
}
/** NotFoundError: an unknown run or call id (or another tenant's). */
export class NotFoundError extends FanoutError {
  override name = "NotFoundError";
}
/** ResourceExhaustedError: a cap, a rate or a budget passed; quotaViolations say which. */
export class ResourceExhaustedError extends FanoutError {
  override name = "ResourceExhaustedError";
}
/** DeadlineExceededError: the call's timeoutMs passed. */
export class DeadlineExceededError extends FanoutError {
  override name = "DeadlineExceededError";
}
/** UnavailableError: the server could not be reached, or the connection dropped. */
export class UnavailableError extends FanoutError {
  override name = "UnavailableError";
}
/** FailedPreconditionError: the call does not fit the run's state (a reused key with another spec, an ended run). */
export class FailedPreconditionError extends FanoutError {
  override name = "FailedPreconditionError";
}

const subclasses: Partial<Record<FanoutErrorCode, typeof FanoutError>> = {
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
export function newFanoutError(
  code: FanoutErrorCode,
  message: string,
  details?: ConstructorParameters<typeof FanoutError>[2],
): FanoutError {
  const Class = subclasses[code] ?? FanoutError;
  return new Class(code, message, details);
}

/**
 * fromConnectError turns whatever a call threw into a FanoutError. A fetch
 * that failed or a stream cut before its end (connect-web calls both
 * UNKNOWN) is UNAVAILABLE, as connect-node and gRPC call a dropped
 * connection, so that one code means "the network, try again". Each
 * secret is cut out of the message, in case a proxy echoed a header.
 */
export function fromConnectError(err: unknown, secrets: readonly string[] = []): FanoutError {
  if (err instanceof FanoutError) return err;
  const e = ConnectError.from(err);
  let code = codeNames[e.code] ?? "UNKNOWN";
  if (e.code === Code.Unknown && isNetworkFailure(e)) code = "UNAVAILABLE";
  let message = e.rawMessage;
  for (const s of secrets) if (s) message = message.split(s).join("[redacted]");
  const fieldViolations = e.findDetails(BadRequestSchema).flatMap((d) =>
    d.fieldViolations.map((v) => ({ field: v.field, description: v.description })),
  );
  const quotaViolations = e.findDetails(QuotaFailureSchema).flatMap((d) =>
    d.violations.map((v) => ({ subject: v.subject, description: v.description })),
  );
  const info = e.findDetails(ErrorInfoSchema)[0];
  const reason = info && { reason: info.reason, domain: info.domain, metadata: { ...info.metadata } };
  // The ConnectError is not kept as the cause: its message is unredacted.
  return newFanoutError(code, message, { fieldViolations, quotaViolations, ...(reason ? { reason } : {}) });
}

// isNetworkFailure reports whether an UNKNOWN error came from the network,
// not the server: fetch's TypeError ("fetch failed", "terminated"), or
// connect-web's stream that ended without its end-of-stream message.
function isNetworkFailure(e: ConnectError): boolean {
  if (e.cause instanceof TypeError) return true;
  return e.rawMessage === "missing EndStreamResponse" || /network|fetch failed|terminated|ECONNRESET|socket/i.test(e.rawMessage);
}
