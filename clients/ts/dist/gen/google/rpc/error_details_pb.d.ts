import type { GenFile, GenMessage } from "@bufbuild/protobuf/codegenv2";
import type { Message } from "@bufbuild/protobuf";
/**
 * Describes the file google/rpc/error_details.proto.
 */
export declare const file_google_rpc_error_details: GenFile;
/**
 * ErrorInfo is the reason of an error (WatchRun's WATCH_READER_BEHIND).
 *
 * @generated from message google.rpc.ErrorInfo
 */
export type ErrorInfo = Message<"google.rpc.ErrorInfo"> & {
    /**
     * The reason, UPPER_SNAKE_CASE.
     *
     * @generated from field: string reason = 1;
     */
    reason: string;
    /**
     * The service that sent it.
     *
     * @generated from field: string domain = 2;
     */
    domain: string;
    /**
     * More about it (WATCH_READER_BEHIND: after_sequence).
     *
     * @generated from field: map<string, string> metadata = 3;
     */
    metadata: {
        [key: string]: string;
    };
};
/**
 * Describes the message google.rpc.ErrorInfo.
 * Use `create(ErrorInfoSchema)` to create a new message.
 */
export declare const ErrorInfoSchema: GenMessage<ErrorInfo>;
/**
 * QuotaFailure says which quota a RESOURCE_EXHAUSTED error passed.
 *
 * @generated from message google.rpc.QuotaFailure
 */
export type QuotaFailure = Message<"google.rpc.QuotaFailure"> & {
    /**
     * The quotas passed.
     *
     * @generated from field: repeated google.rpc.QuotaFailure.Violation violations = 1;
     */
    violations: QuotaFailure_Violation[];
};
/**
 * Describes the message google.rpc.QuotaFailure.
 * Use `create(QuotaFailureSchema)` to create a new message.
 */
export declare const QuotaFailureSchema: GenMessage<QuotaFailure>;
/**
 * Violation is one quota passed.
 *
 * @generated from message google.rpc.QuotaFailure.Violation
 */
export type QuotaFailure_Violation = Message<"google.rpc.QuotaFailure.Violation"> & {
    /**
     * What the quota is on.
     *
     * @generated from field: string subject = 1;
     */
    subject: string;
    /**
     * How it was passed.
     *
     * @generated from field: string description = 2;
     */
    description: string;
};
/**
 * Describes the message google.rpc.QuotaFailure.Violation.
 * Use `create(QuotaFailure_ViolationSchema)` to create a new message.
 */
export declare const QuotaFailure_ViolationSchema: GenMessage<QuotaFailure_Violation>;
/**
 * BadRequest names the fields of an INVALID_ARGUMENT request that are wrong.
 *
 * @generated from message google.rpc.BadRequest
 */
export type BadRequest = Message<"google.rpc.BadRequest"> & {
    /**
     * The wrong fields.
     *
     * @generated from field: repeated google.rpc.BadRequest.FieldViolation field_violations = 1;
     */
    fieldViolations: BadRequest_FieldViolation[];
};
/**
 * Describes the message google.rpc.BadRequest.
 * Use `create(BadRequestSchema)` to create a new message.
 */
export declare const BadRequestSchema: GenMessage<BadRequest>;
/**
 * FieldViolation is one wrong field.
 *
 * @generated from message google.rpc.BadRequest.FieldViolation
 */
export type BadRequest_FieldViolation = Message<"google.rpc.BadRequest.FieldViolation"> & {
    /**
     * The field's path, as the proto spells it: spec.tasks[0].token_budget.
     *
     * @generated from field: string field = 1;
     */
    field: string;
    /**
     * What is wrong with it.
     *
     * @generated from field: string description = 2;
     */
    description: string;
};
/**
 * Describes the message google.rpc.BadRequest.FieldViolation.
 * Use `create(BadRequest_FieldViolationSchema)` to create a new message.
 */
export declare const BadRequest_FieldViolationSchema: GenMessage<BadRequest_FieldViolation>;
