//! Host networking of the test node, through iproute2: one bridge for Pods (which also holds
//! the Service and LoadBalancer addresses), and a namespace + veth per Pod.

use super::Error;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use tokio::process::Command;

/// The names and ranges of one instance's network (see the module docs of `node`).
#[derive(Debug, Clone)]
pub struct Network {
    index: u8,
}

impl Network {
    pub fn new(index: u8) -> Self {
        Self { index }
    }

    pub fn bridge(&self) -> String {
        format!("cxbr{}", self.index)
    }

    /// Service and LoadBalancer addresses live on the bridge too (as /32s): some sandboxes have
    /// no dummy-interface module, and deleting the bridge then takes them along.
    fn service_interface(&self) -> String {
        self.bridge()
    }

    /// The bridge's address: the Pods' default gateway and the node's InternalIP.
    pub fn gateway(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, 244, self.index, 1)
    }

    pub fn pod_cidr(&self) -> String {
        format!("10.244.{}.0/24", self.index)
    }

    pub fn pod_ip(&self, host: u8) -> Ipv4Addr {
        super::pod_ip(self.index, host)
    }

    pub fn load_balancer_ip(&self, host: u8) -> Ipv4Addr {
        Ipv4Addr::new(10, 97, self.index, host)
    }

    /// Network namespace of a Pod, named from its UID; the `cxN-` prefix is what down.sh
    /// looks for.
    pub fn namespace_of(&self, uid: &str) -> String {
        let short: String = uid.chars().filter(|c| *c != '-').take(10).collect();
        format!("cx{}-{short}", self.index)
    }

    fn host_veth(&self, uid: &str) -> String {
        let short: String = uid.chars().filter(|c| *c != '-').take(8).collect();
        format!("cxv{}{short}", self.index)
    }

    /// Files `ip netns exec` bind-mounts over /etc inside the namespace.
    pub fn etc_dir(&self, netns: &str) -> PathBuf {
        PathBuf::from("/etc/netns").join(netns)
    }

    /// Creates the bridge and the service interface; removes Pod namespaces a previous agent of
    /// this index left behind.
    pub async fn setup_host(&self) -> Result<(), Error> {
        for netns in list_namespaces().await? {
            if netns.starts_with(&format!("cx{}-", self.index)) {
                self.delete_pod_network(&netns).await;
            }
        }
        let bridge = self.bridge();
        if !link_exists(&bridge).await {
            ip(&["link", "add", &bridge, "type", "bridge"]).await?;
            ip(&[
                "addr",
                "add",
                &format!("{}/24", self.gateway()),
                "dev",
                &bridge,
            ])
            .await?;
        }
        ip(&["link", "set", &bridge, "up"]).await?;
        Ok(())
    }

    pub async fn teardown_host(&self) {
        for netns in list_namespaces().await.unwrap_or_default() {
            if netns.starts_with(&format!("cx{}-", self.index)) {
                self.delete_pod_network(&netns).await;
            }
        }
        let _ = ip(&["link", "delete", &self.bridge()]).await;
    }

    /// A namespace with `eth0` (`ip`/24, default route via the bridge) and `lo` up.
    pub async fn create_pod_network(
        &self,
        uid: &str,
        netns: &str,
        address: Ipv4Addr,
    ) -> Result<(), Error> {
        // A leftover of an earlier attempt for the same Pod.
        self.delete_pod_network(netns).await;
        let veth = self.host_veth(uid);
        ip(&["netns", "add", netns]).await?;
        ip(&[
            "link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns", netns,
        ])
        .await?;
        ip(&["link", "set", &veth, "master", &self.bridge(), "up"]).await?;
        ip(&[
            "-n",
            netns,
            "addr",
            "add",
            &format!("{address}/24"),
            "dev",
            "eth0",
        ])
        .await?;
        ip(&["-n", netns, "link", "set", "eth0", "up"]).await?;
        ip(&["-n", netns, "link", "set", "lo", "up"]).await?;
        ip(&[
            "-n",
            netns,
            "route",
            "add",
            "default",
            "via",
            &self.gateway().to_string(),
        ])
        .await?;
        Ok(())
    }

    /// Kills whatever still runs in the namespace, then deletes it (its veth goes with it).
    pub async fn delete_pod_network(&self, netns: &str) {
        if let Ok(out) = Command::new("ip")
            .args(["netns", "pids", netns])
            .output()
            .await
        {
            for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                if let Ok(pid) = pid.parse::<i32>() {
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(pid),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                }
            }
        }
        let _ = ip(&["netns", "delete", netns]).await;
        let _ = std::fs::remove_dir_all(self.etc_dir(netns));
    }

    /// Puts a Service or LoadBalancer address on the service interface, so listeners can bind it
    /// and both the host and Pods (through their default route) reach it.
    pub async fn add_service_address(&self, address: Ipv4Addr) -> Result<(), Error> {
        let out = Command::new("ip")
            .args([
                "addr",
                "add",
                &format!("{address}/32"),
                "dev",
                &self.service_interface(),
            ])
            .output()
            .await
            .map_err(Error::io("running ip"))?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        if out.status.success() || stderr.contains("File exists") {
            Ok(())
        } else {
            Err(Error::Command {
                command: format!("ip addr add {address}/32"),
                stderr: stderr.trim().to_owned(),
            })
        }
    }

    pub async fn remove_service_address(&self, address: Ipv4Addr) {
        let _ = ip(&[
            "addr",
            "delete",
            &format!("{address}/32"),
            "dev",
            &self.service_interface(),
        ])
        .await;
    }
}

async fn link_exists(name: &str) -> bool {
    Command::new("ip")
        .args(["link", "show", name])
        .output()
        .await
        .is_ok_and(|o| o.status.success())
}

async fn list_namespaces() -> Result<Vec<String>, Error> {
    let out = Command::new("ip")
        .args(["netns", "list"])
        .output()
        .await
        .map_err(Error::io("running ip netns list"))?;
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .collect())
}

async fn ip(args: &[&str]) -> Result<(), Error> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .await
        .map_err(Error::io("running ip"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(Error::Command {
            command: format!("ip {}", args.join(" ")),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        })
    }
}
