//! The apiserver's one error type: every failure becomes a `metav1.Status` with the upstream
//! `reason` and `code`, written by one `IntoResponse`.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde_json::json;

/// One cause of an `Invalid` (422) error: which field and what is wrong with it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Cause {
    /// Upstream cause type, e.g. `FieldValueInvalid`, `FieldValueRequired`.
    pub reason: String,
    /// Human-readable message.
    pub message: String,
    /// The field path, e.g. `metadata.name`.
    pub field: String,
}

impl Cause {
    /// An invalid value at `field`.
    pub fn invalid(field: &str, value: &str, detail: &str) -> Self {
        Cause {
            reason: "FieldValueInvalid".into(),
            message: format!("Invalid value: \"{value}\": {detail}"),
            field: field.into(),
        }
    }
    /// A required field is missing.
    pub fn required(field: &str, detail: &str) -> Self {
        Cause {
            reason: "FieldValueRequired".into(),
            message: if detail.is_empty() {
                "Required value".into()
            } else {
                format!("Required value: {detail}")
            },
            field: field.into(),
        }
    }
    /// A field that may not change.
    pub fn immutable(field: &str) -> Self {
        Cause {
            reason: "FieldValueInvalid".into(),
            message: "Invalid value: field is immutable".into(),
            field: field.into(),
        }
    }
    /// A field that may not be set or changed this way.
    pub fn forbidden(field: &str, detail: &str) -> Self {
        Cause {
            reason: "FieldValueForbidden".into(),
            message: format!("Forbidden: {detail}"),
            field: field.into(),
        }
    }
    /// A value that is already taken.
    pub fn duplicate(field: &str, value: &str) -> Self {
        Cause {
            reason: "FieldValueDuplicate".into(),
            message: format!("Duplicate value: \"{value}\""),
            field: field.into(),
        }
    }
    /// A value outside the allowed set.
    pub fn not_supported(field: &str, value: &str, allowed: &[&str]) -> Self {
        let allowed: Vec<String> = allowed.iter().map(|a| format!("\"{a}\"")).collect();
        Cause {
            reason: "FieldValueNotSupported".into(),
            message: format!(
                "Unsupported value: \"{value}\": supported values: {}",
                allowed.join(", ")
            ),
            field: field.into(),
        }
    }
    /// The user-facing line of this cause.
    pub fn line(&self) -> String {
        format!("{}: {}", self.field, self.message)
    }
}

/// A failed API request, rendered as a `Status`.
#[derive(Clone, Debug, PartialEq)]
pub struct ApiError {
    /// HTTP status code.
    pub code: u16,
    /// Upstream `StatusReason`.
    pub reason: &'static str,
    /// Human-readable message.
    pub message: String,
    /// `details` of the Status (name, group, kind, causes), if any.
    pub details: Option<serde_json::Value>,
    /// Seconds to put in `Retry-After`.
    pub retry_after: Option<u64>,
    /// `metadata.continue` of the Status: where an expired list can go on from.
    pub list_continue: Option<String>,
}

/// The apiserver's result type.
pub type ApiResult<T> = Result<T, ApiError>;

/// `group` and `resource` as upstream prints them in messages (`deployments.apps`, `pods`).
pub fn qualified(group: &str, resource: &str) -> String {
    if group.is_empty() {
        resource.to_owned()
    } else {
        format!("{resource}.{group}")
    }
}

impl ApiError {
    fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            code,
            reason,
            message: message.into(),
            details: None,
            retry_after: None,
            list_continue: None,
        }
    }

    fn with_details(mut self, group: &str, kind_or_resource: &str, name: &str) -> Self {
        self.details = Some(json!({"name": name, "group": group, "kind": kind_or_resource}));
        self
    }

    /// 400 BadRequest.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }
    /// 401 Unauthorized.
    pub fn unauthorized() -> Self {
        Self::new(401, "Unauthorized", "Unauthorized")
    }
    /// 403 Forbidden.
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(403, "Forbidden", message)
    }
    /// 403 Forbidden for an object, as upstream's `NewForbidden`: `<resource> "<name>" is
    /// forbidden: <why>` (no quotes without a name).
    pub fn forbidden_object(group: &str, resource: &str, name: &str, why: &str) -> Self {
        let what = qualified(group, resource);
        let message = match name {
            "" => format!("{what} is forbidden: {why}"),
            _ => format!("{what} \"{name}\" is forbidden: {why}"),
        };
        Self::new(403, "Forbidden", message).with_details(group, resource, name)
    }
    /// 404 NotFound for an object.
    pub fn not_found(group: &str, resource: &str, name: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("{} \"{name}\" not found", qualified(group, resource)),
        )
        .with_details(group, resource, name)
    }
    /// 404 NotFound for a path that names no resource.
    pub fn no_route(path: &str) -> Self {
        let _ = path;
        Self::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )
        .with_details("", "", "")
    }
    /// 405 MethodNotAllowed.
    pub fn method_not_supported(group: &str, resource: &str, verb: &str) -> Self {
        Self::new(
            405,
            "MethodNotAllowed",
            format!(
                "{verb} is not supported on resources of kind \"{}\"",
                qualified(group, resource)
            ),
        )
    }
    /// 405 for a method the path's route does not have, as upstream's go-restful answers.
    pub fn method_not_allowed() -> Self {
        Self::new(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        )
        .with_details("", "", "")
    }
    /// 406 NotAcceptable.
    pub fn not_acceptable(message: impl Into<String>) -> Self {
        Self::new(406, "NotAcceptable", message)
    }
    /// 409 AlreadyExists.
    pub fn already_exists(group: &str, resource: &str, name: &str) -> Self {
        Self::new(
            409,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", qualified(group, resource)),
        )
        .with_details(group, resource, name)
    }
    /// 409 Conflict for a stale resourceVersion or failed precondition.
    pub fn conflict(group: &str, resource: &str, name: &str, why: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": {why}",
                qualified(group, resource)
            ),
        )
        .with_details(group, resource, name)
    }
    /// 409 Conflict: the object changed since it was read.
    pub fn stale(group: &str, resource: &str, name: &str) -> Self {
        Self::conflict(
            group,
            resource,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }
    /// 410 Expired: a resourceVersion or continue token too old.
    pub fn expired(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }
    /// 410 Expired for a continue token whose revision has been compacted away, carrying
    /// `token`: the rest of the list at the latest revision, as upstream offers it.
    pub fn inconsistent_continue(token: String) -> Self {
        ApiError {
            list_continue: Some(token),
            ..Self::expired(
                "The provided continue parameter is too old to display a consistent list result. \
                 You can start a new list without the continue parameter, or use the continue \
                 token in this response to retrieve the remainder of the results. Continuing \
                 with the provided token results in an inconsistent list - objects that were \
                 created, modified, or deleted between the time the first chunk was returned \
                 and now may show up in the list.",
            )
        }
    }
    /// 410 Expired for a watch from a revision compacted away (`requested` is the watch's
    /// resourceVersion, `oldest` the oldest revision still kept), in upstream's words.
    pub fn watch_too_old(requested: i64, oldest: i64) -> Self {
        Self::expired(format!(
            "too old resource version: {requested} ({})",
            oldest - 1
        ))
    }
    /// 413 RequestEntityTooLarge.
    pub fn too_large(limit: usize) -> Self {
        Self::new(
            413,
            "RequestEntityTooLarge",
            format!("Request entity too large: limit is {limit}"),
        )
    }
    /// 415 UnsupportedMediaType.
    pub fn unsupported_media_type(content_type: &str) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: application/json, application/yaml, application/vnd.kubernetes.protobuf (got {content_type:?})"
            ),
        )
    }
    /// 422 Invalid with field causes.
    pub fn invalid(group: &str, kind: &str, name: &str, causes: Vec<Cause>) -> Self {
        let lines: Vec<String> = causes.iter().map(Cause::line).collect();
        let message = if lines.len() == 1 {
            format!("{kind} \"{name}\" is invalid: {}", lines[0])
        } else {
            format!("{kind} \"{name}\" is invalid: [{}]", lines.join(", "))
        };
        let mut e = Self::new(422, "Invalid", message);
        e.details = Some(json!({"name": name, "group": group, "kind": kind, "causes": causes}));
        e
    }
    /// 429 TooManyRequests.
    pub fn too_many_requests(retry_after: u64) -> Self {
        let mut e = Self::new(
            429,
            "TooManyRequests",
            "Too many requests, please try again later.",
        );
        e.retry_after = Some(retry_after);
        e
    }
    /// 504 Timeout: the request took longer than the server allows.
    pub fn timeout(limit: std::time::Duration) -> Self {
        Self::new(
            504,
            "Timeout",
            format!("request did not complete within {}s", limit.as_secs()),
        )
    }
    /// 500 InternalError.
    pub fn internal(err: impl std::fmt::Display) -> Self {
        Self::new(
            500,
            "InternalError",
            format!("Internal error occurred: {err}"),
        )
    }
    /// 503 ServiceUnavailable.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(503, "ServiceUnavailable", message)
    }

    /// The `metav1.Status` object (for embedding, e.g. in a watch's ERROR event).
    pub fn status(&self) -> serde_json::Value {
        serde_json::to_value(self.body()).expect("a Status serializes")
    }

    /// The Status as upstream encodes it: fields in Go struct order, empty ones omitted.
    fn body(&self) -> StatusBody<'_> {
        let text = |k: &str| {
            self.details
                .as_ref()
                .and_then(|d| d.get(k))
                .and_then(serde_json::Value::as_str)
                .unwrap_or_default()
        };
        let causes = self
            .details
            .as_ref()
            .and_then(|d| d.get("causes"))
            .and_then(serde_json::Value::as_array)
            .map(|c| c.iter().map(CauseBody::of).collect())
            .unwrap_or_default();
        let details = StatusDetails {
            name: text("name"),
            group: text("group"),
            kind: text("kind"),
            uid: text("uid"),
            causes,
            retry_after_seconds: self.retry_after.filter(|r| *r > 0),
        };
        let empty = details.name.is_empty()
            && details.group.is_empty()
            && details.kind.is_empty()
            && details.uid.is_empty()
            && details.causes.is_empty()
            && details.retry_after_seconds.is_none();
        StatusBody {
            kind: "Status",
            api_version: "v1",
            metadata: ListMetaBody {
                continue_token: self.list_continue.as_deref(),
            },
            status: "Failure",
            message: &self.message,
            reason: self.reason,
            details: (self.details.is_some() || !empty).then_some(details),
            code: self.code,
        }
    }

    /// The response body: the Status's JSON and a newline, byte for byte as upstream's
    /// encoder writes it.
    pub fn body_bytes(&self) -> Vec<u8> {
        let mut body = serde_json::to_vec(&self.body()).expect("a Status serializes");
        body.push(b'\n');
        body
    }
}

fn is_empty(s: &&str) -> bool {
    s.is_empty()
}

/// `metav1.Status`, fields in upstream's struct order.
#[derive(Serialize)]
struct StatusBody<'a> {
    kind: &'static str,
    #[serde(rename = "apiVersion")]
    api_version: &'static str,
    metadata: ListMetaBody<'a>,
    status: &'static str,
    #[serde(skip_serializing_if = "is_empty")]
    message: &'a str,
    #[serde(skip_serializing_if = "is_empty")]
    reason: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    details: Option<StatusDetails<'a>>,
    code: u16,
}

/// The Status's `metav1.ListMeta`: only `continue` is ever set on an error.
#[derive(Serialize)]
struct ListMetaBody<'a> {
    #[serde(rename = "continue", skip_serializing_if = "Option::is_none")]
    continue_token: Option<&'a str>,
}

/// `metav1.StatusDetails`, fields in upstream's struct order, empty ones omitted.
#[derive(Serialize)]
struct StatusDetails<'a> {
    #[serde(skip_serializing_if = "is_empty")]
    name: &'a str,
    #[serde(skip_serializing_if = "is_empty")]
    group: &'a str,
    #[serde(skip_serializing_if = "is_empty")]
    kind: &'a str,
    #[serde(skip_serializing_if = "is_empty")]
    uid: &'a str,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    causes: Vec<CauseBody<'a>>,
    #[serde(rename = "retryAfterSeconds", skip_serializing_if = "Option::is_none")]
    retry_after_seconds: Option<u64>,
}

/// `metav1.StatusCause`: reason, message, field.
#[derive(Serialize)]
struct CauseBody<'a> {
    #[serde(skip_serializing_if = "is_empty")]
    reason: &'a str,
    #[serde(skip_serializing_if = "is_empty")]
    message: &'a str,
    #[serde(skip_serializing_if = "is_empty")]
    field: &'a str,
}

impl<'a> CauseBody<'a> {
    fn of(v: &'a serde_json::Value) -> Self {
        let text = |k: &str| {
            v.get(k)
                .and_then(serde_json::Value::as_str)
                .unwrap_or_default()
        };
        CauseBody {
            reason: text("reason"),
            message: text("message"),
            field: text("field"),
        }
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({}): {}", self.code, self.reason, self.message)
    }
}

impl std::error::Error for ApiError {}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = self.body_bytes();
        let mut resp = (
            StatusCode::from_u16(self.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            body,
        )
            .into_response();
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if let Some(r) = self.retry_after {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(r));
        }
        resp
    }
}

impl From<minik8s_storage::Error> for ApiError {
    fn from(e: minik8s_storage::Error) -> Self {
        use minik8s_storage::Error as S;
        match e {
            // A list at an exact revision compacted away (watches say it their own way:
            // `watch_too_old`).
            S::Compacted { .. } => {
                ApiError::expired("The resourceVersion for the provided list is too old.")
            }
            S::FutureRevision { requested, .. } => ApiError::new(
                504,
                "Timeout",
                format!("Too large resource version: {requested}"),
            ),
            S::Closed => ApiError::unavailable("the storage is shutting down"),
            S::Unavailable(detail) => {
                ApiError::unavailable(format!("etcd is unavailable: {detail}"))
            }
            other => ApiError::internal(other),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_bodies_are_byte_identical_to_upstreams() {
        // The Python client's test_create_from_multi_resource_yaml_with_conflict compares this.
        let e = ApiError::already_exists("", "services", "mock-2");
        assert_eq!(
            String::from_utf8(e.body_bytes()).unwrap(),
            "{\"kind\":\"Status\",\"apiVersion\":\"v1\",\"metadata\":{},\"status\":\"Failure\",\"message\":\"services \\\"mock-2\\\" already exists\",\"reason\":\"AlreadyExists\",\"details\":{\"name\":\"mock-2\",\"kind\":\"services\"},\"code\":409}\n"
        );
        let e = ApiError::no_route("/nothing");
        assert_eq!(
            String::from_utf8(e.body_bytes()).unwrap(),
            "{\"kind\":\"Status\",\"apiVersion\":\"v1\",\"metadata\":{},\"status\":\"Failure\",\"message\":\"the server could not find the requested resource\",\"reason\":\"NotFound\",\"details\":{},\"code\":404}\n"
        );
        let e = ApiError::not_found("apps", "deployments", "web");
        assert!(
            String::from_utf8(e.body_bytes())
                .unwrap()
                .contains("\"details\":{\"name\":\"web\",\"group\":\"apps\",\"kind\":\"deployments\"},\"code\":404}")
        );
        let e = ApiError::too_many_requests(1);
        assert!(String::from_utf8(e.body_bytes()).unwrap().ends_with(
            "\"reason\":\"TooManyRequests\",\"details\":{\"retryAfterSeconds\":1},\"code\":429}\n"
        ));
        let e = ApiError::invalid(
            "",
            "ConfigMap",
            "x",
            vec![Cause::required(
                "metadata.name",
                "name or generateName is required",
            )],
        );
        assert!(String::from_utf8(e.body_bytes()).unwrap().contains(
            "\"details\":{\"name\":\"x\",\"kind\":\"ConfigMap\",\"causes\":[{\"reason\":\"FieldValueRequired\",\"message\":\"Required value: name or generateName is required\",\"field\":\"metadata.name\"}]},\"code\":422}"
        ));
    }
}
