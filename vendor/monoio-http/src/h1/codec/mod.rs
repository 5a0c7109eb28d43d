mod client;
mod server;

pub mod decoder;
pub mod encoder;
pub use client::ClientCodec;
pub use server::ServerCodec;
