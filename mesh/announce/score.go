package announce

import (
	"time"

	pubsub "github.com/libp2p/go-libp2p-pubsub"
	"github.com/libp2p/go-libp2p/core/peer"
)

// GossipSub peer scoring on the capability topic (gossipsub v1.1 P1-P7; the package doc
// says how they fit together). Units: score points; a count is per message or per peer.
// The figures that matter are the thresholds and what it takes to cross them: see each.
const (
	// Topic weight: the capability topic is the only scored topic, so its points count as
	// they are.
	scoreTopicWeight = 1.0

	// P1, time in the mesh: one point per minute a peer spends in this node's mesh for the
	// topic, up to 10. A quiet honest peer (one that brings few first deliveries because
	// others are quicker) still earns some standing.
	scoreTimeInMeshWeight  = 1.0
	scoreTimeInMeshQuantum = time.Minute
	scoreTimeInMeshCap     = 10.0

	// P2, first message deliveries: one point per valid announcement a peer was first to
	// bring, up to 50, fading to nothing over an hour without new ones. This is what an
	// honest neighbour earns by doing its job; with P1 the most any peer can hold is 60
	// (scoreTopicCap).
	scoreFirstDeliveriesWeight = 1.0
	scoreFirstDeliveriesCap    = 50.0
	scoreFirstDeliveriesDecay  = time.Hour

	// P3 and P3b (mesh message delivery rate and its sticky failure penalty) are off. The
	// topic carries one message per node per heartbeat (15 s): too little and too bursty
	// for a delivery-rate floor to tell a slow honest peer from a withholding one, and
	// such floors are what gossipsub operators most often find penalizing honest peers.

	// P4, invalid messages: minus ten points times the square of the number of messages the
	// peer forwarded that this node's validator Rejected (a forged or malformed vector,
	// author ≠ peer_id; see the validator table in the package doc), fading over an hour.
	// Ignored messages (expired, replayed, rate-limited, over a forwarder's budget) cost
	// nothing. A peer with no standing crosses the gossip threshold at its 3rd invalid
	// message and the publish threshold at its 4th; at its 7th (-490) it is graylisted
	// whatever standing it had (at most +60). Squared, so one stray bug costs little and a
	// flood costs everything.
	scoreInvalidWeight = -10.0
	scoreInvalidDecay  = time.Hour

	// P6, IP colocation: minus ten points times the square of the number of peers beyond
	// three that share one IP address. Several honest nodes behind one NAT are normal (a
	// household, an office): three cost nothing, four -10 (paid for by a few minutes of
	// standing), five -40; ten cost -490, below the graylist. Of a Sybil's 30 identities on
	// one IP (F11), the node's per-IP connection cap (8) lets only eight in, and each of
	// them scores -250: below the gossip and publish thresholds and under zero, so out of
	// every mesh. GossipSub itself leaves loopback addresses out of this count
	// (go-libp2p-pubsub's getIPs), so a testnet's nodes, all on 127.0.0.1, are never
	// penalized, and no setting changes that.
	scoreColocationWeight    = -10.0
	scoreColocationThreshold = 3

	// P7, behaviour penalties the router counts itself (a GRAFT during the PRUNE backoff,
	// an IHAVE not followed by the message): ten forgiven, since a loaded machine breaks a
	// promise now and then; beyond that minus one point times the square of the excess,
	// fading over ten minutes. 21 beyond the ten reach the graylist.
	scoreBehaviourWeight    = -1.0
	scoreBehaviourThreshold = 10.0
	scoreBehaviourDecay     = 10 * time.Minute

	// scoreTopicCap bounds what a peer can hold in positive points: P1's cap plus P2's.
	scoreTopicCap = scoreTimeInMeshCap*scoreTimeInMeshWeight + scoreFirstDeliveriesCap*scoreFirstDeliveriesWeight

	// scoreRetain is how long the counters of a peer that disconnected are kept: as long as
	// an invalid message takes to fade, so a graylisted peer does not start afresh by
	// reconnecting with the same identity.
	scoreRetain = time.Hour
)

// Score thresholds. Each is a point below which GossipSub stops doing something for a peer.
const (
	// ScoreGossip: no IHAVE gossip to or from the peer. Reached by a peer with no standing
	// at its 3rd invalid message, or six peers on one IP.
	ScoreGossip = -50.0
	// ScorePublish: the peer is never a target for this node's own announcements (as a
	// fanout or floodsub peer; flood publishing, which it also gates, is off).
	ScorePublish = -100.0
	// ScoreGraylist: every RPC of the peer is dropped unread, before validation: its
	// messages cost this node nothing more. Reached at the 7th invalid message, or with
	// ten peers on one IP.
	ScoreGraylist = -400.0
	// ScoreAcceptPX: peer exchange (the addresses a peer hands over when it prunes us) is
	// followed only from a peer at or above this: ten first deliveries, or ten minutes in
	// the mesh. A peer cannot steer a newcomer's connections before it has done some work.
	ScoreAcceptPX = 10.0
	// ScoreOpportunisticGraft: when the median score of the mesh falls below this,
	// GossipSub grafts better-scoring peers (against a mesh taken over by idle peers).
	ScoreOpportunisticGraft = 1.0
)

// PeerScore returns GossipSub's peer-score parameters and thresholds for the capability
// topic of mesh, for pubsub.WithPeerScore.
func PeerScore(mesh string) (*pubsub.PeerScoreParams, *pubsub.PeerScoreThresholds) {
	topic := &pubsub.TopicScoreParams{
		TopicWeight: scoreTopicWeight,

		TimeInMeshWeight:  scoreTimeInMeshWeight,
		TimeInMeshQuantum: scoreTimeInMeshQuantum,
		TimeInMeshCap:     scoreTimeInMeshCap,

		FirstMessageDeliveriesWeight: scoreFirstDeliveriesWeight,
		FirstMessageDeliveriesDecay:  pubsub.ScoreParameterDecay(scoreFirstDeliveriesDecay),
		FirstMessageDeliveriesCap:    scoreFirstDeliveriesCap,

		InvalidMessageDeliveriesWeight: scoreInvalidWeight,
		InvalidMessageDeliveriesDecay:  pubsub.ScoreParameterDecay(scoreInvalidDecay),
	}
	params := &pubsub.PeerScoreParams{
		Topics:        map[string]*pubsub.TopicScoreParams{Topic(mesh): topic},
		TopicScoreCap: scoreTopicCap,
		// P5, the application's own score, is not used: reputation judges work done for
		// this node, not gossip, and mixing the two would let a slow peer lose its mesh
		// slot.
		AppSpecificScore:            func(peer.ID) float64 { return 0 },
		IPColocationFactorWeight:    scoreColocationWeight,
		IPColocationFactorThreshold: scoreColocationThreshold,
		BehaviourPenaltyWeight:      scoreBehaviourWeight,
		BehaviourPenaltyThreshold:   scoreBehaviourThreshold,
		BehaviourPenaltyDecay:       pubsub.ScoreParameterDecay(scoreBehaviourDecay),
		DecayInterval:               pubsub.DefaultDecayInterval,
		DecayToZero:                 pubsub.DefaultDecayToZero,
		RetainScore:                 scoreRetain,
	}
	thresholds := &pubsub.PeerScoreThresholds{
		GossipThreshold:             ScoreGossip,
		PublishThreshold:            ScorePublish,
		GraylistThreshold:           ScoreGraylist,
		AcceptPXThreshold:           ScoreAcceptPX,
		OpportunisticGraftThreshold: ScoreOpportunisticGraft,
	}
	return params, thresholds
}
