//! Who a client is, for the per-address limits: its address group (an IPv6 /64 is one client),
//! the operator's trusted proxies (`--trusted-proxy`), and the client address a request carries
//! through one of them (`X-Forwarded-For`).

use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use axum::extract::{ConnectInfo, Request};
use axum::http::HeaderMap;
use ipnet::IpNet;

/// The address one client is counted by: IPv6 clients usually hold a whole /64, so every
/// address of one /64 is one client; an IPv4-mapped IPv6 address is its IPv4 address.
pub(crate) fn address_group(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::V6(Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
    }
}

/// The networks whose connections are proxies the operator runs (`--trusted-proxy`): their own
/// address is not held to the per-address connection cap, and the client address they name in
/// `X-Forwarded-For` is the one the per-address limits count.
#[derive(Clone, Debug, Default)]
pub struct TrustedProxies(Arc<[IpNet]>);

impl TrustedProxies {
    pub fn new(networks: Vec<IpNet>) -> Self {
        Self(networks.into())
    }

    /// `--trusted-proxy`'s value: addresses or CIDR networks, comma-separated.
    pub fn parse(s: &str) -> Result<Self, String> {
        parse_networks(s).map(Self::new)
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            IpAddr::V4(_) => ip,
        };
        self.0.iter().any(|net| net.contains(&ip))
    }

    /// The client a request comes from. From a trusted proxy: the right-most `X-Forwarded-For`
    /// address that is not itself a trusted proxy (the addresses left of it were written by the
    /// client, who can write anything); without a usable header, the proxy itself. From anyone
    /// else: the TCP peer, whatever the headers say.
    pub(crate) fn client(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        if !self.contains(peer) {
            return peer;
        }
        let hops = headers.get_all("x-forwarded-for").iter().filter_map(|v| v.to_str().ok());
        let hops: Vec<&str> = hops.flat_map(|v| v.split(',')).map(str::trim).collect();
        for hop in hops.iter().rev() {
            let Some(ip) = parse_hop(hop) else { return peer };
            if !self.contains(ip) {
                return ip;
            }
        }
        peer
    }
}

/// An `X-Forwarded-For` element: an address, possibly with a port (`[v6]:port`, `v4:port`).
fn parse_hop(hop: &str) -> Option<IpAddr> {
    hop.parse::<IpAddr>().ok().or_else(|| hop.parse::<SocketAddr>().ok().map(|s| s.ip()))
}

/// Addresses or CIDR networks, comma-separated.
fn parse_networks(s: &str) -> Result<Vec<IpNet>, String> {
    s.split(',')
        .map(str::trim)
        .filter(|part| !part.is_empty())
        .map(|part| {
            part.parse::<IpNet>()
                .or_else(|_| part.parse::<IpAddr>().map(IpNet::from))
                .map_err(|_| format!("{part:?} is not an address or a CIDR network (e.g. 10.0.0.0/8)"))
        })
        .collect()
}

/// The client address the accept loop resolved for a request (see [`TrustedProxies::client`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct ClientAddr(pub IpAddr);

/// The client a request comes from: what the accept loop resolved, else the TCP peer; `None`
/// only for requests built in-process (tests).
pub(crate) fn of(req: &Request) -> Option<IpAddr> {
    req.extensions()
        .get::<ClientAddr>()
        .map(|c| c.0)
        .or_else(|| req.extensions().get::<ConnectInfo<SocketAddr>>().map(|c| c.0.ip()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(xff: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in xff {
            h.append("x-forwarded-for", v.parse().unwrap());
        }
        h
    }

    #[test]
    fn only_a_trusted_proxy_names_the_client() {
        let trusted = TrustedProxies::new(parse_networks("10.0.0.0/8, 192.0.2.1").unwrap());
        let proxy: IpAddr = "10.1.2.3".parse().unwrap();
        let stranger: IpAddr = "198.51.100.7".parse().unwrap();
        // The right-most hop that is not a proxy; what the client wrote further left is ignored.
        let forged = headers(&["1.1.1.1, 203.0.113.5", "10.9.9.9"]);
        assert_eq!(trusted.client(proxy, &forged), "203.0.113.5".parse::<IpAddr>().unwrap());
        assert_eq!(trusted.client(stranger, &forged), stranger);
        assert_eq!(trusted.client(proxy, &headers(&[])), proxy);
        assert_eq!(trusted.client(proxy, &headers(&["garbage"])), proxy);
        assert_eq!(trusted.client(proxy, &headers(&["[2001:db8::1]:443"])), "2001:db8::1".parse::<IpAddr>().unwrap());
        assert!(trusted.contains("::ffff:192.0.2.1".parse().unwrap()));
        assert!(parse_networks("10.0.0.0/33").is_err() && parse_networks("proxy").is_err());
    }

    #[test]
    fn an_ipv6_slash_64_is_one_client() {
        let a = address_group("2001:db8:1:2::1".parse().unwrap());
        assert_eq!(a, address_group("2001:db8:1:2:ffff::9".parse().unwrap()));
        assert_ne!(a, address_group("2001:db8:1:3::1".parse().unwrap()));
        assert_eq!(address_group("::ffff:10.0.0.1".parse().unwrap()), "10.0.0.1".parse::<IpAddr>().unwrap());
    }
}
