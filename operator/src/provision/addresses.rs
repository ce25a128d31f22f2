//! A Gateway's requested address (`spec.addresses`) on its dedicated proxy's Service.

use crate::compile::gateway::requested_addresses;
use gateway_api::apis::standard::gateways::Gateway;
use k8s_openapi::api::core::v1::Service;

/// Asks the Service for the Gateway's requested address through `spec.loadBalancerIP`: the
/// one field LoadBalancer providers commonly honour (cloud providers, MetalLB, Cilium), and
/// it takes one address. With several addresses, or a Service that is not a LoadBalancer,
/// nothing is asked; the status writer then sets the Gateway's Programmed=False and says why.
pub fn request(service: &mut Service, gateway: &Gateway) {
    let Ok(addresses) = requested_addresses(gateway, true) else {
        return;
    };
    let Some(spec) = service.spec.as_mut() else {
        return;
    };
    if spec.type_.as_deref() == Some("LoadBalancer")
        && let [ip] = addresses.as_slice()
    {
        spec.load_balancer_ip = Some(ip.to_string());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ServiceSpec;

    fn gateway(addresses: &str) -> Gateway {
        serde_yaml::from_str(&format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{name: gw, namespace: web}}\nspec:\n  gatewayClassName: dedicated\n  addresses: {addresses}\n  listeners: [{{name: http, port: 80, protocol: HTTP}}]\n"
        ))
        .expect("gateway")
    }

    fn service(type_: &str) -> Service {
        Service {
            spec: Some(ServiceSpec {
                type_: Some(type_.into()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn asked(type_: &str, addresses: &str) -> Option<String> {
        let mut svc = service(type_);
        request(&mut svc, &gateway(addresses));
        svc.spec.and_then(|s| s.load_balancer_ip)
    }

    #[test]
    fn one_ip_address_is_asked_of_a_load_balancer() {
        assert_eq!(
            asked("LoadBalancer", "[{type: IPAddress, value: 10.97.3.250}]").as_deref(),
            Some("10.97.3.250")
        );
        // The type defaults to IPAddress; IPv6 is normalised.
        assert_eq!(
            asked("LoadBalancer", "[{value: '2001:DB8::0:1'}]").as_deref(),
            Some("2001:db8::1")
        );
    }

    #[test]
    fn nothing_is_asked_when_the_service_cannot_take_it() {
        assert_eq!(
            asked(
                "LoadBalancer",
                "[{value: 10.97.3.250}, {value: 10.97.3.251}]"
            ),
            None
        );
        assert_eq!(asked("ClusterIP", "[{value: 10.97.3.250}]"), None);
        assert_eq!(
            asked("LoadBalancer", "[{type: Hostname, value: lb.example}]"),
            None
        );
        assert_eq!(asked("LoadBalancer", "[{type: IPAddress}]"), None);
        assert_eq!(asked("LoadBalancer", "[]"), None);
    }
}
