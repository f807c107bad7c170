//! The service's single error enum, mapped to wire codes in one place.

use crate::cluster::HeartbeatError;
use fskv_kv::KvError;
use fskv_types::{ErrorCode, Status};

#[derive(Debug, thiserror::Error)]
pub enum MgmtdError {
    #[error("not the primary mgmtd (primary: {})", primary.as_deref().unwrap_or("unknown"))]
    NotPrimary { primary: Option<String> },
    #[error(transparent)]
    Heartbeat(#[from] HeartbeatError),
    #[error("kv engine: {0}")]
    Kv(#[from] KvError),
    #[error("layout: {0}")]
    Layout(String),
    #[error("corrupt mgmtd record {key}: {detail}")]
    Corrupt { key: String, detail: String },
    #[error("lost the primary lease")]
    LeaseLost,
    /// A heartbeat over a connection authenticated as another principal
    /// (`service.rs`, "Who may heartbeat").
    #[error("a heartbeat for {claimed} from a connection authenticated as {principal}")]
    WrongPrincipal { claimed: String, principal: String },
}

impl MgmtdError {
    pub fn code(&self) -> ErrorCode {
        match self {
            MgmtdError::NotPrimary { .. } | MgmtdError::LeaseLost => ErrorCode::NotPrimary,
            MgmtdError::Heartbeat(HeartbeatError::StaleGeneration { .. } | HeartbeatError::DeclaredFailed { .. }) => {
                ErrorCode::StaleNodeGeneration
            }
            MgmtdError::Heartbeat(HeartbeatError::UnknownTarget { .. }) => ErrorCode::InvalidArgument,
            MgmtdError::Kv(e) => e.code(),
            MgmtdError::Layout(_) => ErrorCode::InvalidArgument,
            MgmtdError::Corrupt { .. } => ErrorCode::Internal,
            MgmtdError::WrongPrincipal { .. } => ErrorCode::PermissionDenied,
        }
    }
}

impl From<MgmtdError> for Status {
    fn from(e: MgmtdError) -> Status {
        Status::new(e.code(), e.to_string())
    }
}

pub type Result<T, E = MgmtdError> = std::result::Result<T, E>;
