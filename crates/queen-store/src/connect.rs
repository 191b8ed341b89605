//! Opening a connection, one host at a time.
//!
//! tokio-postgres bounds only the TCP connect of each host with `connect_timeout`. A host that
//! accepts connections and never answers (a frozen server, a proxy whose backend hung) then holds
//! the whole attempt, and the hosts after it (a promoted standby) are never tried. Here each host
//! but the last has `connect_timeout` for the whole of its attempt (TCP, TLS, start-up and the
//! `target_session_attrs` check), as libpq's `connect_timeout` does; the last is bounded by the
//! caller (the pool's create timeout).

use std::time::Duration;

use futures::future::BoxFuture;
use tokio_postgres::config::{Config, Host, LoadBalanceHosts};
use tokio_postgres::tls::MakeTlsConnect;
use tokio_postgres::{Client, Socket};
use tokio_postgres_rustls::MakeRustlsConnect;

/// The connection half of a client, which must be polled (spawned) for the client to work.
pub type Connection = tokio_postgres::Connection<Socket, <MakeRustlsConnect as MakeTlsConnect<Socket>>::Stream>;

/// Connects to the first of `config`'s hosts that answers in time and suits its
/// `target_session_attrs`.
pub async fn connect(config: &Config, tls: &MakeRustlsConnect) -> Result<(Client, Connection), tokio_postgres::Error> {
    let bound = config.get_connect_timeout().copied();
    let mut hosts = one_host_each(config);
    let (Some(bound), Some(last)) = (bound, hosts.pop()) else {
        return config.connect(tls.clone()).await;
    };
    for host in hosts {
        match tokio::time::timeout(bound, host.connect(tls.clone())).await {
            Ok(Ok(connected)) => return Ok(connected),
            Ok(Err(e)) => tracing::debug!(host = ?host.get_hosts(), error = %e, "trying the next host"),
            Err(_) => tracing::warn!(
                host = ?host.get_hosts(),
                bound_ms = bound.as_millis() as u64,
                "a host did not answer within connect_timeout; trying the next"
            ),
        }
    }
    last.connect(tls.clone()).await
}

/// The pool's way of connecting: [`connect`], with the connection spawned.
pub(crate) struct HostByHost {
    pub tls: MakeRustlsConnect,
}

impl deadpool_postgres::Connect for HostByHost {
    fn connect(
        &self,
        config: &Config,
    ) -> BoxFuture<'_, Result<(Client, tokio::task::JoinHandle<()>), tokio_postgres::Error>> {
        let config = config.clone();
        Box::pin(async move {
            let (client, connection) = connect(&config, &self.tls).await?;
            let task = tokio::spawn(async move {
                if let Err(e) = connection.await {
                    tracing::warn!(error = %e, "a pooled connection failed");
                }
            });
            Ok((client, task))
        })
    }
}

/// `config` split into one configuration per host, in order; `config` alone when there is
/// nothing to split, or when tokio-postgres is to pick the order (`load_balance_hosts=random`) or
/// to refuse the list (counts of hosts, addresses and ports that do not match).
fn one_host_each(config: &Config) -> Vec<Config> {
    let (hosts, addresses, ports) = (config.get_hosts(), config.get_hostaddrs(), config.get_ports());
    let count = hosts.len().max(addresses.len());
    let mismatched = (!hosts.is_empty() && !addresses.is_empty() && hosts.len() != addresses.len())
        || (ports.len() > 1 && ports.len() != count);
    if count <= 1 || mismatched || config.get_load_balance_hosts() == LoadBalanceHosts::Random {
        return vec![config.clone()];
    }
    (0..count)
        .map(|i| {
            let mut one = without_hosts(config);
            match hosts.get(i) {
                Some(Host::Tcp(name)) => {
                    one.host(name);
                }
                #[cfg(unix)]
                Some(Host::Unix(path)) => {
                    one.host_path(path);
                }
                None => {}
            }
            if let Some(address) = addresses.get(i) {
                one.hostaddr(*address);
            }
            if let Some(port) = ports.get(i).or(ports.first()) {
                one.port(*port);
            }
            one
        })
        .collect()
}

/// Every setting of `config` but its hosts, addresses and ports.
fn without_hosts(config: &Config) -> Config {
    let mut one = Config::new();
    if let Some(user) = config.get_user() {
        one.user(user);
    }
    if let Some(password) = config.get_password() {
        one.password(password);
    }
    if let Some(dbname) = config.get_dbname() {
        one.dbname(dbname);
    }
    if let Some(options) = config.get_options() {
        one.options(options);
    }
    if let Some(name) = config.get_application_name() {
        one.application_name(name);
    }
    if let Some(timeout) = config.get_connect_timeout() {
        one.connect_timeout(*timeout);
    }
    if let Some(timeout) = config.get_tcp_user_timeout() {
        one.tcp_user_timeout(*timeout);
    }
    if let Some(interval) = config.get_keepalives_interval() {
        one.keepalives_interval(interval);
    }
    if let Some(retries) = config.get_keepalives_retries() {
        one.keepalives_retries(retries);
    }
    one.ssl_mode(config.get_ssl_mode())
        .ssl_negotiation(config.get_ssl_negotiation())
        .keepalives(config.get_keepalives())
        .keepalives_idle(config.get_keepalives_idle())
        .target_session_attrs(config.get_target_session_attrs())
        .channel_binding(config.get_channel_binding())
        .load_balance_hosts(config.get_load_balance_hosts());
    one
}

/// How long opening one connection to `config` through [`connect`] may take in all:
/// `connect_timeout` for each host but the last, then the last host's connect and its start-up
/// exchange.
pub fn whole_attempt(connect_timeout: Duration, config: &Config) -> Duration {
    let hosts = config.get_hosts().len().max(config.get_hostaddrs().len()).max(1);
    let hosts = u32::try_from(hosts).unwrap_or(u32::MAX);
    connect_timeout.saturating_mul(hosts.saturating_add(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_host_keeps_every_other_setting() {
        let config: Config = "postgres://queen:secret@primary:5433,standby:5434/queue_db?\
            target_session_attrs=read-write&connect_timeout=3&application_name=queen&sslmode=require\
            &keepalives_idle=7&options=-c%20x%3Dy&tcp_user_timeout=9000&channel_binding=disable"
            .parse()
            .expect("a URL");
        let hosts = one_host_each(&config);
        let names: Vec<_> = hosts.iter().map(|one| (one.get_hosts().to_vec(), one.get_ports().to_vec())).collect();
        assert_eq!(
            names,
            [(vec![Host::Tcp("primary".into())], vec![5433]), (vec![Host::Tcp("standby".into())], vec![5434])]
        );
        // The second host put back beside the first, the two print the same: nothing else was lost.
        let mut again = hosts[0].clone();
        again.host("standby").port(5434);
        assert_eq!(format!("{again:?}"), format!("{config:?}"));
    }

    #[test]
    fn one_port_serves_every_host_and_one_host_is_not_split() {
        let config: Config = "host=a,b port=5433 user=u connect_timeout=2".parse().expect("a setting string");
        let hosts = one_host_each(&config);
        assert_eq!(hosts.iter().map(|h| h.get_ports().to_vec()).collect::<Vec<_>>(), [[5433], [5433]]);
        let single: Config = "host=a port=5433".parse().expect("a setting string");
        assert_eq!(one_host_each(&single).len(), 1);
        let random: Config = "host=a,b load_balance_hosts=random".parse().expect("a setting string");
        assert_eq!(one_host_each(&random).len(), 1, "tokio-postgres picks the order");
    }

    #[test]
    fn opening_a_connection_may_try_every_host_in_turn_then_start_up() {
        let connect = Duration::from_secs(5);
        let hosts = |settings: &str| settings.parse::<Config>().expect("a setting string");
        assert_eq!(whole_attempt(connect, &hosts("host=a")), Duration::from_secs(10));
        assert_eq!(whole_attempt(connect, &hosts("host=a,b,c")), Duration::from_secs(20), "a primary and two standbys");
        assert_eq!(whole_attempt(connect, &hosts("hostaddr=10.0.0.1,10.0.0.2,10.0.0.3")), Duration::from_secs(20));
        assert_eq!(whole_attempt(connect, &hosts("user=u")), Duration::from_secs(10), "the default host counts as one");
    }
}
