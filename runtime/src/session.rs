//! (in progress)
#[derive(Debug)]
pub struct Session;
#[derive(Debug)]
pub struct SessionOptions;
#[derive(Debug)]
pub struct IoInfo;
#[derive(Debug, thiserror::Error)]
#[error("session")]
pub struct SessionError;
