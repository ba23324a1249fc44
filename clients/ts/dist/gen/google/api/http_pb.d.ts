import type { GenFile, GenMessage } from "@bufbuild/protobuf/codegenv2";
import type { Message } from "@bufbuild/protobuf";
/**
 * Describes the file google/api/http.proto.
 */
export declare const file_google_api_http: GenFile;
/**
 * Defines the HTTP configuration for an API service.
 *
 * @generated from message google.api.Http
 */
export type Http = Message<"google.api.Http"> & {
    /**
     * A list of HTTP configuration rules that apply to individual API methods.
     *
     * @generated from field: repeated google.api.HttpRule rules = 1;
     */
    rules: HttpRule[];
    /**
     * When set to true, URL path parameters will be fully URI-decoded except in
     * cases of single segment matches in reserved expansion, where "%2F" will be
     * left encoded.
     *
     * @generated from field: bool fully_decode_reserved_expansion = 2;
     */
    fullyDecodeReservedExpansion: boolean;
};
/**
 * Describes the message google.api.Http.
 * Use `create(HttpSchema)` to create a new message.
 */
export declare const HttpSchema: GenMessage<Http>;
/**
 * gRPC Transcoding: the mapping of an RPC method to an HTTP REST method.
 *
 * @generated from message google.api.HttpRule
 */
export type HttpRule = Message<"google.api.HttpRule"> & {
    /**
     * Selects a method to which this rule applies.
     *
     * @generated from field: string selector = 1;
     */
    selector: string;
    /**
     * The URL pattern and HTTP method.
     *
     * @generated from oneof google.api.HttpRule.pattern
     */
    pattern: {
        /**
         * Maps to HTTP GET.
         *
         * @generated from field: string get = 2;
         */
        value: string;
        case: "get";
    } | {
        /**
         * Maps to HTTP PUT.
         *
         * @generated from field: string put = 3;
         */
        value: string;
        case: "put";
    } | {
        /**
         * Maps to HTTP POST.
         *
         * @generated from field: string post = 4;
         */
        value: string;
        case: "post";
    } | {
        /**
         * Maps to HTTP DELETE.
         *
         * @generated from field: string delete = 5;
         */
        value: string;
        case: "delete";
    } | {
        /**
         * Maps to HTTP PATCH.
         *
         * @generated from field: string patch = 6;
         */
        value: string;
        case: "patch";
    } | {
        /**
         * A custom HTTP method.
         *
         * @generated from field: google.api.CustomHttpPattern custom = 8;
         */
        value: CustomHttpPattern;
        case: "custom";
    } | {
        case: undefined;
        value?: undefined;
    };
    /**
     * The name of the request field whose value is mapped to the HTTP request
     * body, or `*` for every field not captured by the path pattern.
     *
     * @generated from field: string body = 7;
     */
    body: string;
    /**
     * The name of the response field whose value is mapped to the HTTP
     * response body.
     *
     * @generated from field: string response_body = 12;
     */
    responseBody: string;
    /**
     * Additional HTTP bindings for the selector.
     *
     * @generated from field: repeated google.api.HttpRule additional_bindings = 11;
     */
    additionalBindings: HttpRule[];
};
/**
 * Describes the message google.api.HttpRule.
 * Use `create(HttpRuleSchema)` to create a new message.
 */
export declare const HttpRuleSchema: GenMessage<HttpRule>;
/**
 * A custom pattern is used for defining custom HTTP verb.
 *
 * @generated from message google.api.CustomHttpPattern
 */
export type CustomHttpPattern = Message<"google.api.CustomHttpPattern"> & {
    /**
     * The name of this custom HTTP verb.
     *
     * @generated from field: string kind = 1;
     */
    kind: string;
    /**
     * The path matched by this custom verb.
     *
     * @generated from field: string path = 2;
     */
    path: string;
};
/**
 * Describes the message google.api.CustomHttpPattern.
 * Use `create(CustomHttpPatternSchema)` to create a new message.
 */
export declare const CustomHttpPatternSchema: GenMessage<CustomHttpPattern>;
