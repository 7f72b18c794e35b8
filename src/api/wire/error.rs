//! The one error body every route answers with: a stable code for
//! programs and a message for people (docs/api.md lists the codes).
//!
//! docs/openapi.yaml describes the same shapes.

use serde::{Deserialize, Serialize};

/// Every error body: `{"error": {"code": ..., "message": ...}}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ErrorDetail {
    /// Stable, machine-readable (see docs/api.md).
    pub code: String,
    /// For people: what went wrong and what to do.
    pub message: String,
}
