//! A connection as the executor holds it: the transport's connection and its properties.

use std::sync::Arc;

use ferroccl_transport::{
    Connection, Doorbell, Header, MemRef, Payload, PayloadMut, PeerInfo, PollFd, Progress,
    Properties, Region, Result, WaitKind,
};

/// A connection to one peer, with what the executor needs to know of its transport.
#[derive(Debug)]
pub(crate) struct Conn {
    conn: Box<dyn Connection>,
    /// The transport's properties.
    pub props: Properties,
}

impl Conn {
    pub(crate) fn new(conn: Box<dyn Connection>, props: Properties) -> Conn {
        Conn { conn, props }
    }

    /// Payload bytes a message of the connection's small-message lane holds (0: no lane).
    pub(crate) fn lane_capacity(&mut self) -> usize {
        self.conn.small_lane().map_or(0, |l| l.capacity())
    }

    /// The connection's small-message lane, if it has one.
    pub(crate) fn lane(&mut self) -> Option<&mut dyn ferroccl_transport::SmallLane> {
        self.conn.small_lane()
    }

    /// Whether waiting for this connection means waiting on the doorbell, not on descriptors.
    pub(crate) fn uses_doorbell(&self) -> bool {
        self.props.wait == WaitKind::Doorbell
    }

    pub(crate) fn doorbell(&self) -> Option<Arc<dyn Doorbell>> {
        self.conn.doorbell()
    }

    /// Whether the connection has work in flight that only polling sees finish.
    pub(crate) fn in_flight(&self) -> bool {
        self.conn.in_flight()
    }

    pub(crate) fn peer(&self) -> &PeerInfo {
        self.conn.peer()
    }

    /// Details for logs (`+cma`, a delay).
    pub(crate) fn describe(&self) -> String {
        self.conn.describe()
    }

    pub(crate) fn send(
        &mut self,
        h: &Header,
        payload: Payload<'_>,
        p: &mut Progress,
    ) -> Result<bool> {
        self.conn.send(h, payload, p)
    }

    pub(crate) fn recv(
        &mut self,
        h: &mut Header,
        payload: PayloadMut<'_>,
        p: &mut Progress,
    ) -> Result<bool> {
        self.conn.recv(h, payload, p)
    }

    /// Whether the connection lends received bytes ([`Connection::recv_lent`]).
    pub(crate) fn lends(&self) -> bool {
        self.conn.lends()
    }

    pub(crate) fn recv_lent(
        &mut self,
        h: &mut Header,
        len: usize,
        granule: usize,
        p: &mut Progress,
        sink: &mut dyn FnMut(usize, &[u8]) -> Result<()>,
    ) -> Result<bool> {
        self.conn.recv_lent(h, len, granule, p, sink)
    }

    /// Whether the connection lends received device memory
    /// ([`Connection::recv_lent_device`]).
    pub(crate) fn lends_device(&self) -> bool {
        self.conn.lends_device()
    }

    pub(crate) fn recv_lent_device(
        &mut self,
        h: &mut Header,
        len: usize,
        p: &mut Progress,
        sink: &mut ferroccl_transport::LentSink<'_>,
    ) -> Result<bool> {
        self.conn.recv_lent_device(h, len, p, sink)
    }

    pub(crate) fn poll_fds(&self, sending: bool, receiving: bool, out: &mut Vec<PollFd>) {
        self.conn.poll_fds(sending, receiving, out)
    }

    /// Announces the destination of the next incoming message (one-sided transports).
    pub(crate) fn post_recv(&mut self, dst: MemRef, region: Option<&Region>) -> Result<()> {
        self.conn.post_recv(dst, region)
    }

    /// Registers `mem` with the transport, where it needs registration.
    pub(crate) fn register(&mut self, mem: MemRef) -> Result<Option<Region>> {
        self.conn.register(mem)
    }

    pub(crate) fn shutdown(&mut self) {
        self.conn.shutdown()
    }
}
