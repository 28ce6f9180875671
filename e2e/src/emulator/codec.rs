//! A minimal prost codec for `tonic::client::Grpc`, so one client can speak both CRI API versions.
//!
//! `runtime.v1` and `runtime.v1alpha2` are wire-identical apart from the service path
//! (KUBELET-CRI §8.1), so the emulator encodes `k8s_cri::v1` messages and only switches the path.
//! tonic 0.14 moved its prost codec into the `tonic-prost` crate, which `crisp-e2e` does not depend
//! on directly; this is the same twenty lines.

use std::marker::PhantomData;

use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::Status;

/// Encodes `T`, decodes `U`, both prost messages.
#[derive(Debug)]
pub struct ProstCodec<T, U>(PhantomData<fn(T) -> U>);

impl<T, U> Default for ProstCodec<T, U> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

// === impl ProstCodec ===

impl<T, U> Codec for ProstCodec<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = ProstDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstEncoder(PhantomData)
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProstDecoder(PhantomData)
    }
}

/// Encoder half of [`ProstCodec`].
#[derive(Debug)]
pub struct ProstEncoder<T>(PhantomData<fn(T)>);

impl<T: prost::Message> Encoder for ProstEncoder<T> {
    type Item = T;
    type Error = Status;

    fn encode(&mut self, item: T, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
        // EncodeBuf grows on demand, so this only fails on a bug in prost.
        item.encode(buf).map_err(|e| Status::internal(format!("prost encode: {e}")))
    }
}

/// Decoder half of [`ProstCodec`].
#[derive(Debug)]
pub struct ProstDecoder<U>(PhantomData<fn() -> U>);

impl<U: prost::Message + Default> Decoder for ProstDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        U::decode(buf)
            .map(Some)
            // gRPC maps parse errors to INTERNAL.
            .map_err(|e| Status::internal(format!("prost decode: {e}")))
    }
}
