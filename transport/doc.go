// Package transport will hold the libp2p stream protocols (/meshinfer/infer/1.0.0), WebRTC
// direct dispatch and the coordinator gateway.
//
// Not built yet: today nodes only discover each other and exchange capability vectors over
// GossipSub (mesh/announce). transport must never import mesh; node connects the two.
package transport
