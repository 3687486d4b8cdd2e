//! Where a connection accepted on the outbound listener was going before proxy-init's iptables
//! rules redirected it here.
//!
//! The kernel keeps the destination the app asked for in the connection's conntrack entry and
//! hands it back through `SO_ORIGINAL_DST` (IPv4) or `IP6T_SO_ORIGINAL_DST` (IPv6). A connection
//! that was not redirected (the app called the proxy's port itself) has no such entry, or one whose
//! original destination is the listener: that is direct use. The socket option sits behind
//! [`OrigDst`] so the accept path is tested without root or iptables.

use std::{io, net::SocketAddr};
use tokio::net::TcpStream;

/// What an accepted connection is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Destination {
    /// The app called the proxy's listener itself.
    Direct,
    /// The app called this address and iptables sent the connection here.
    Redirected(SocketAddr),
}

impl Destination {
    /// A connection accepted on `local` whose original destination was `orig`.
    pub fn of(local: SocketAddr, orig: Option<SocketAddr>) -> Self {
        match orig {
            Some(dst) if dst != local => Self::Redirected(dst),
            _ => Self::Direct,
        }
    }
}

/// Reads the original destination of an accepted connection; `None` when it has none.
pub trait OrigDst: Send + Sync + 'static {
    fn orig_dst(&self, stream: &TcpStream) -> io::Result<Option<SocketAddr>>;
}

/// Never redirected: every connection is direct use (platforms without `SO_ORIGINAL_DST`).
#[derive(Clone, Copy, Debug, Default)]
pub struct NoOrigDst;

impl OrigDst for NoOrigDst {
    fn orig_dst(&self, _: &TcpStream) -> io::Result<Option<SocketAddr>> {
        Ok(None)
    }
}

/// The kernel's answer, from the conntrack entry of the connection (Linux).
#[derive(Clone, Copy, Debug, Default)]
pub struct SoOriginalDst;

#[cfg(target_os = "linux")]
impl OrigDst for SoOriginalDst {
    fn orig_dst(&self, stream: &TcpStream) -> io::Result<Option<SocketAddr>> {
        use nix::{
            errno::Errno,
            sys::socket::{getsockopt, sockopt},
        };
        use std::net::{Ipv4Addr, Ipv6Addr, SocketAddrV4, SocketAddrV6};
        let answer = if stream.local_addr()?.is_ipv4() {
            getsockopt(stream, sockopt::OriginalDst).map(|sin| {
                SocketAddr::V4(SocketAddrV4::new(
                    Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)),
                    u16::from_be(sin.sin_port),
                ))
            })
        } else {
            getsockopt(stream, sockopt::Ip6tOriginalDst).map(|sin6| {
                SocketAddr::V6(SocketAddrV6::new(
                    Ipv6Addr::from(sin6.sin6_addr.s6_addr),
                    u16::from_be(sin6.sin6_port),
                    sin6.sin6_flowinfo,
                    sin6.sin6_scope_id,
                ))
            })
        };
        match answer {
            Ok(addr) => Ok(Some(addr)),
            // No conntrack entry (nothing was redirected, or conntrack is not loaded).
            Err(Errno::ENOENT | Errno::ENOPROTOOPT | Errno::EOPNOTSUPP) => Ok(None),
            Err(e) => Err(io::Error::from(e)),
        }
    }
}

#[cfg(not(target_os = "linux"))]
impl OrigDst for SoOriginalDst {
    fn orig_dst(&self, _: &TcpStream) -> io::Result<Option<SocketAddr>> {
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_listeners_own_address_is_direct_use() {
        let local: SocketAddr = "127.0.0.1:4140".parse().unwrap();
        assert_eq!(Destination::of(local, None), Destination::Direct);
        assert_eq!(Destination::of(local, Some(local)), Destination::Direct);
        let svc: SocketAddr = "10.96.0.10:8000".parse().unwrap();
        assert_eq!(
            Destination::of(local, Some(svc)),
            Destination::Redirected(svc)
        );
    }

    /// A connection nothing redirected has no original destination other than the listener.
    #[tokio::test]
    async fn an_unredirected_connection_reads_as_direct() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let local = listener.local_addr().unwrap();
        let _client = TcpStream::connect(local).await.unwrap();
        let (stream, _) = listener.accept().await.unwrap();
        let orig = SoOriginalDst.orig_dst(&stream).unwrap();
        assert_eq!(Destination::of(local, orig), Destination::Direct);
    }
}
