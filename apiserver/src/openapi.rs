//! OpenAPI v2 and v3 documents generated from the k8s-openapi types (filled below).

use crate::Api;
use crate::error::{ApiError, ApiResult};
use axum::http::HeaderMap;
use axum::response::Response;
use std::sync::Arc;

/// Serves `/openapi/...`.
pub fn serve(api: &Arc<Api>, parts: &[&str], headers: &HeaderMap) -> ApiResult<Response> {
    let _ = (api, headers);
    Err(ApiError::no_route(&parts.join("/")))
}
