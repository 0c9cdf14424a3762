//! The ZMTP codec and sockets against raw TCP peers.
