//! A TCP relay (to a discovery server, to the API server) that can make the connections it
//! carries go silent: bytes stop moving both ways, yet neither end sees a FIN or a reset, as when a
//! Pod's network is torn down under an open connection. Connections opened later pass, unless
//! the relay is cut.

use std::sync::{Arc, Mutex};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// A silenced connection: the client's side, and the server's once it was connected.
type Held = (TcpStream, Option<TcpStream>);

pub struct SilenceRelay {
    pub port: u16,
    /// Bumped by `silence`: connections opened under an older generation stop forwarding.
    generation: watch::Sender<u64>,
    /// Silenced connections, held open so that neither end is told anything.
    held: Arc<Mutex<Vec<Held>>>,
    /// Connections accepted so far.
    accepted: watch::Receiver<u64>,
    /// Set by `cut`: connections accepted from then on are held silent too.
    cut: Arc<std::sync::atomic::AtomicBool>,
}

impl SilenceRelay {
    /// Relays 127.0.0.1:`port` (a fresh port) to 127.0.0.1:`target`.
    pub async fn start(target: u16) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (generation, _) = watch::channel(0u64);
        let (count, accepted) = watch::channel(0u64);
        let held = Arc::new(Mutex::new(Vec::new()));
        let cut = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (generations, kept, is_cut) = (generation.clone(), held.clone(), cut.clone());
        tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                count.send_modify(|n| *n += 1);
                // The generation first: `cut` sets its flag before it bumps the generation, so
                // a connection either sees the flag here or is silenced by the bump.
                let mut silenced = generations.subscribe();
                let born = *silenced.borrow_and_update();
                if is_cut.load(std::sync::atomic::Ordering::Acquire) {
                    // Accepted (the kernel would have done so anyway) and never answered.
                    kept.lock().unwrap().push((client, None));
                    continue;
                }
                let kept = kept.clone();
                tokio::spawn(async move {
                    let Ok(mut server) = TcpStream::connect(("127.0.0.1", target)).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                        _ = silenced.wait_for(|g| *g > born) => {
                            kept.lock().unwrap().push((client, Some(server)));
                        }
                    }
                });
            }
        });
        Self {
            port,
            generation,
            held,
            accepted,
            cut,
        }
    }

    /// Every connection open now stops forwarding and stays open.
    pub fn silence(&self) {
        self.generation.send_modify(|g| *g += 1);
    }

    /// Every connection, open now or opened later, goes silent: the peer behind the relay is
    /// unreachable without anyone being told.
    pub fn cut(&self) {
        self.cut.store(true, std::sync::atomic::Ordering::Release);
        self.silence();
    }

    /// How many connections the relay has accepted.
    pub fn accepted(&self) -> u64 {
        *self.accepted.borrow()
    }

    /// How many connections it holds silent.
    pub fn silenced(&self) -> usize {
        self.held.lock().unwrap().len()
    }
}
