// Package inference will hold the domain types of an inference request (messages, token
// events, usage, the closed set of typed terminal errors) and the backends that serve them:
// the built-in synthetic model and an OpenAI-compatible upstream.
//
// Not built yet: nodes announce no models until this package exists (see the data-plane
// issue). It is a leaf: it must not import other project packages, libp2p or pion.
package inference
