package layer

import (
	"runtime"
	"slices"

	"golang.org/x/sys/cpu"
)

// An AEAD names the cipher an encryption layer seals its records with,
// as a hello negotiates it ([Handshake.AEAD]). Its values are what the
// hello carries: never renumber them.
type AEAD uint8

const (
	// AEADDefault is what a hello that negotiated nothing gives: the
	// layer's first cipher (ChaCha20-Poly1305 for noise).
	AEADDefault AEAD = 0
	// AEADChaChaPoly is ChaCha20-Poly1305, fast and constant-time in
	// software on any CPU.
	AEADChaChaPoly AEAD = 1
	// AEADAESGCM is AES-256-GCM, faster where the CPU has AES and
	// carry-less multiply instructions, and never chosen where it does
	// not: Go's AES without them is neither fast nor constant-time.
	AEADAESGCM AEAD = 2
)

func (a AEAD) String() string {
	switch a {
	case AEADDefault:
		return "default"
	case AEADChaChaPoly:
		return "chacha20-poly1305"
	case AEADAESGCM:
		return "aes-256-gcm"
	}
	return "unknown"
}

// An AEADNegotiator is a [HandshakeFilter] whose cipher its hello
// negotiates: the dialer's hello offers the ciphers AEADs returns
// ([LocalAEADs], or fewer), the listener answers with the first of its
// own [LocalAEADs] the offer holds ([ChooseAEAD]), and both sides'
// filters find the answer in [Handshake.AEAD]. The offer and the answer
// are in the hello's transcript, which the layer binds to, so no one on
// the way can push the two ends to another choice (the Noise
// specification's negotiation through the prologue). An empty offer
// offers nothing: the hello then carries no offer.
type AEADNegotiator interface {
	HandshakeFilter
	AEADs() []AEAD
}

// LocalAEADs returns the ciphers this machine runs well, fastest first:
// AES-256-GCM first where the CPU has the instructions for it (as
// crypto/tls orders its suites), ChaCha20-Poly1305 always.
func LocalAEADs() []AEAD {
	if hasAESGCMHardware {
		return []AEAD{AEADAESGCM, AEADChaChaPoly}
	}
	return []AEAD{AEADChaChaPoly}
}

// ChooseAEAD returns the listener's answer to an offer: the first of
// [LocalAEADs] that the offer holds, so AES-256-GCM only where both ends
// have the instructions; ChaCha20-Poly1305 when they share nothing else.
// Values it does not know in the offer are ignored (a newer dialer's).
func ChooseAEAD(offer []AEAD) AEAD {
	for _, a := range LocalAEADs() {
		if slices.Contains(offer, a) {
			return a
		}
	}
	return AEADChaChaPoly
}

// hasAESGCMHardware is crypto/tls's test for the instructions that make
// AES-GCM fast and constant-time.
var hasAESGCMHardware = func() bool {
	switch runtime.GOARCH {
	case "amd64", "386":
		return cpu.X86.HasAES && cpu.X86.HasPCLMULQDQ
	case "arm64":
		return cpu.ARM64.HasAES && cpu.ARM64.HasPMULL
	case "s390x":
		return cpu.S390X.HasAES && cpu.S390X.HasAESCTR && cpu.S390X.HasGHASH
	case "ppc64", "ppc64le":
		return true // POWER8 and later, which Go requires, have them
	}
	return false
}()
