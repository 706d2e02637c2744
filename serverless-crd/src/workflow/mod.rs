//! Workflows: durable chains of functions with branches (`Workflow`, `WorkflowRun`).

pub mod controller;
pub mod engine;
pub mod types;

pub use types::{Workflow, WorkflowRun, WorkflowRunSpec, WorkflowRunStatus, WorkflowSpec};
