// The three error details fanout's servers send (google.rpc's
// error_details.proto, cut to the messages and fields they set), so that
// ConnectError.findDetails can decode them: the type names and field
// numbers are upstream's
// (https://github.com/googleapis/googleapis/blob/master/google/rpc/error_details.proto),
// the fields fanout never sets are left out (a decoder skips them).
import { fileDesc, messageDesc } from "@bufbuild/protobuf/codegenv2";
/**
 * Describes the file google/rpc/error_details.proto.
 */
export const file_google_rpc_error_details = /*@__PURE__*/ fileDesc("Ch5nb29nbGUvcnBjL2Vycm9yX2RldGFpbHMucHJvdG8SCmdvb2dsZS5ycGMikwEKCUVycm9ySW5mbxIOCgZyZWFzb24YASABKAkSDgoGZG9tYWluGAIgASgJEjUKCG1ldGFkYXRhGAMgAygLMiMuZ29vZ2xlLnJwYy5FcnJvckluZm8uTWV0YWRhdGFFbnRyeRovCg1NZXRhZGF0YUVudHJ5EgsKA2tleRgBIAEoCRINCgV2YWx1ZRgCIAEoCToCOAEieQoMUXVvdGFGYWlsdXJlEjYKCnZpb2xhdGlvbnMYASADKAsyIi5nb29nbGUucnBjLlF1b3RhRmFpbHVyZS5WaW9sYXRpb24aMQoJVmlvbGF0aW9uEg8KB3N1YmplY3QYASABKAkSEwoLZGVzY3JpcHRpb24YAiABKAkigwEKCkJhZFJlcXVlc3QSPwoQZmllbGRfdmlvbGF0aW9ucxgBIAMoCzIlLmdvb2dsZS5ycGMuQmFkUmVxdWVzdC5GaWVsZFZpb2xhdGlvbho0Cg5GaWVsZFZpb2xhdGlvbhINCgVmaWVsZBgBIAEoCRITCgtkZXNjcmlwdGlvbhgCIAEoCWIGcHJvdG8z");
/**
 * Describes the message google.rpc.ErrorInfo.
 * Use `create(ErrorInfoSchema)` to create a new message.
 */
export const ErrorInfoSchema = /*@__PURE__*/ messageDesc(file_google_rpc_error_details, 0);
/**
 * Describes the message google.rpc.QuotaFailure.
 * Use `create(QuotaFailureSchema)` to create a new message.
 */
export const QuotaFailureSchema = /*@__PURE__*/ messageDesc(file_google_rpc_error_details, 1);
/**
 * Describes the message google.rpc.QuotaFailure.Violation.
 * Use `create(QuotaFailure_ViolationSchema)` to create a new message.
 */
export const QuotaFailure_ViolationSchema = /*@__PURE__*/ messageDesc(file_google_rpc_error_details, 1, 0);
/**
 * Describes the message google.rpc.BadRequest.
 * Use `create(BadRequestSchema)` to create a new message.
 */
export const BadRequestSchema = /*@__PURE__*/ messageDesc(file_google_rpc_error_details, 2);
/**
 * Describes the message google.rpc.BadRequest.FieldViolation.
 * Use `create(BadRequest_FieldViolationSchema)` to create a new message.
 */
export const BadRequest_FieldViolationSchema = /*@__PURE__*/ messageDesc(file_google_rpc_error_details, 2, 0);
