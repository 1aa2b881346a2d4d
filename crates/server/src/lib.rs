//! parcache-server: the daemons, as tokio drivers of the protocol and the
//! stores. So far: the data server ([`iod`]).

pub mod iod;
