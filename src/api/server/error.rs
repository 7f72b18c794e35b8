//! API errors: one JSON shape, a stable code and the right HTTP status.

use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

use crate::api::wire::error::{ErrorBody, ErrorDetail};
use crate::cache::BackingErrorKind;
use crate::control::caches::{CacheSpecError, CachesError};
use crate::control::drives::spec::SpecError;
use crate::control::drives::DriveError;
use crate::control::ledger::{Kind, LedgerError};
use crate::dirsync::manager::DirError;
use crate::fuse::AttachError;
use crate::ublk::UblkError;

/// An error response.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    /// Stable code clients match on.
    pub code: &'static str,
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
        }
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_request", message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: ErrorDetail {
                code: self.code.to_owned(),
                message: self.message,
            },
        };
        (self.status, Json(body)).into_response()
    }
}

impl From<SpecError> for ApiError {
    fn from(e: SpecError) -> Self {
        let code = match e {
            SpecError::InvalidName(_) => "invalid_name",
            SpecError::InvalidSize(_) => "invalid_size",
            SpecError::Malformed(_) => "invalid_request",
            SpecError::Persist(_) => "invalid_persistence",
            SpecError::Access(_) => "invalid_access",
            SpecError::Compress(_) => "invalid_compression",
        };
        ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, code, e.to_string())
    }
}

impl From<DriveError> for ApiError {
    fn from(e: DriveError) -> Self {
        use crate::block::backend::Error as StoreError;
        use DriveError as R;
        let (status, code) = match &e {
            R::Spec(s) => return s.clone().into(),
            R::Ledger(l) => return l.into(),
            R::DataBeyondSize(_) => (StatusCode::CONFLICT, "data_beyond_size"),
            R::Store(StoreError::NoSpace(_) | StoreError::HostShort) => {
                (StatusCode::INSUFFICIENT_STORAGE, "no_memory")
            }
            R::Store(_) => (StatusCode::INTERNAL_SERVER_ERROR, "store_error"),
            R::NotReady(_) => (StatusCode::CONFLICT, "drive_not_ready"),
            R::NotPersistent(_) => (StatusCode::CONFLICT, "not_persistent"),
            R::NoStateDir | R::NothingToRestore { .. } | R::Disk(_) => {
                (StatusCode::INTERNAL_SERVER_ERROR, "persist_error")
            }
            R::SyncFailed(_) => (StatusCode::INTERNAL_SERVER_ERROR, "sync_failed"),
            R::Memlock(_) => (StatusCode::INSUFFICIENT_STORAGE, "memlock_limit"),
        };
        ApiError::new(status, code, e.to_string())
    }
}

/// The refusals every kind shares; the code names the kind asked about.
impl From<&LedgerError> for ApiError {
    fn from(e: &LedgerError) -> Self {
        use LedgerError as L;
        let cache = e.kind() == Some(Kind::Cache);
        let (status, code) = match e {
            L::BadName(_) => (StatusCode::UNPROCESSABLE_ENTITY, "invalid_name"),
            L::Taken(_) if cache => (StatusCode::CONFLICT, "cache_exists"),
            L::Taken(_) => (StatusCode::CONFLICT, "drive_exists"),
            L::NotFound(_) if cache => (StatusCode::NOT_FOUND, "cache_not_found"),
            L::NotFound(_) => (StatusCode::NOT_FOUND, "drive_not_found"),
            L::OverBudget(_) => (StatusCode::INSUFFICIENT_STORAGE, "over_budget"),
            L::Busy(_) if cache => (StatusCode::CONFLICT, "cache_busy"),
            L::Busy(_) => (StatusCode::CONFLICT, "drive_busy"),
        };
        ApiError::new(status, code, e.to_string())
    }
}

impl From<AttachError> for ApiError {
    fn from(e: AttachError) -> Self {
        let (status, code) = match &e {
            AttachError::BadMountpoint(_) => (StatusCode::UNPROCESSABLE_ENTITY, "bad_mountpoint"),
            AttachError::AlreadyAttached(_) => (StatusCode::CONFLICT, "already_attached"),
            AttachError::NotFound(_) => (StatusCode::NOT_FOUND, "attachment_not_found"),
            AttachError::Busy(_) => (StatusCode::CONFLICT, "mount_busy"),
            AttachError::Failed(_) => (StatusCode::INTERNAL_SERVER_ERROR, "attach_failed"),
        };
        ApiError::new(status, code, e.to_string())
    }
}

impl From<UblkError> for ApiError {
    fn from(e: UblkError) -> Self {
        let (status, code) = match &e {
            UblkError::NoModule => (StatusCode::SERVICE_UNAVAILABLE, "ublk_unavailable"),
            UblkError::NotPermitted(_) => (StatusCode::FORBIDDEN, "ublk_not_permitted"),
            UblkError::AlreadyAttached { .. } => (StatusCode::CONFLICT, "already_attached"),
            UblkError::NotFound(_) => (StatusCode::NOT_FOUND, "attachment_not_found"),
            UblkError::Busy { .. } => (StatusCode::CONFLICT, "device_busy"),
            UblkError::NotServing(_) => (StatusCode::SERVICE_UNAVAILABLE, "attach_failed"),
            UblkError::Control { .. } | UblkError::Device { .. } => {
                (StatusCode::INTERNAL_SERVER_ERROR, "attach_failed")
            }
        };
        ApiError::new(status, code, e.to_string())
    }
}

impl From<CacheSpecError> for ApiError {
    fn from(e: CacheSpecError) -> Self {
        let code = match e {
            CacheSpecError::InvalidName(_) => "invalid_name",
            CacheSpecError::InvalidSize(_) => "invalid_size",
            CacheSpecError::InvalidOption(_) => "invalid_cache_option",
            CacheSpecError::InvalidBacking(_) => "bad_backing",
        };
        ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, code, e.to_string())
    }
}

impl From<CachesError> for ApiError {
    fn from(e: CachesError) -> Self {
        use CachesError as C;
        let (status, code) = match &e {
            C::Spec(s) => return s.clone().into(),
            C::Ledger(l) => return l.into(),
            C::Backing(b) => match b.kind() {
                BackingErrorKind::Invalid => (StatusCode::UNPROCESSABLE_ENTITY, "bad_backing"),
                BackingErrorKind::Busy => (StatusCode::CONFLICT, "backing_busy"),
                BackingErrorKind::Unreachable => (StatusCode::BAD_GATEWAY, "backing_unreachable"),
            },
            C::Busy(_) => (StatusCode::CONFLICT, "cache_busy"),
            C::DirtyData(_) => (StatusCode::CONFLICT, "dirty_data"),
            C::BackingFailed(_) => (StatusCode::BAD_GATEWAY, "backing_failed"),
            C::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "cache_unavailable"),
            C::Setup(_) => (StatusCode::INTERNAL_SERVER_ERROR, "cache_error"),
        };
        ApiError::new(status, code, e.to_string())
    }
}

impl From<DirError> for ApiError {
    fn from(e: DirError) -> Self {
        let status = match e.code() {
            "dir_not_found" => StatusCode::NOT_FOUND,
            "dir_exists" | "dir_busy" | "dir_locked" | "dir_not_active" | "dir_covered" => {
                StatusCode::CONFLICT
            }
            "dir_refused" | "invalid_request" => StatusCode::UNPROCESSABLE_ENTITY,
            "ram_full" | "disk_full" => StatusCode::INSUFFICIENT_STORAGE,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError::new(status, e.code(), e.to_string())
    }
}

impl From<JsonRejection> for ApiError {
    fn from(r: JsonRejection) -> Self {
        let text = r.body_text();
        match r {
            JsonRejection::JsonSyntaxError(_) => {
                ApiError::new(StatusCode::BAD_REQUEST, "bad_json", text)
            }
            JsonRejection::JsonDataError(_) if text.contains("unknown field") => {
                ApiError::new(StatusCode::BAD_REQUEST, "unknown_field", text)
            }
            JsonRejection::JsonDataError(_) => ApiError::invalid(text),
            JsonRejection::MissingJsonContentType(_) => ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                format!("{text}: send the body with Content-Type: application/json"),
            ),
            _ => ApiError::new(StatusCode::BAD_REQUEST, "bad_request", text),
        }
    }
}

impl From<QueryRejection> for ApiError {
    fn from(r: QueryRejection) -> Self {
        let text = r.body_text();
        if text.contains("unknown field") {
            ApiError::new(StatusCode::BAD_REQUEST, "unknown_field", text)
        } else {
            ApiError::new(StatusCode::BAD_REQUEST, "bad_query", text)
        }
    }
}
