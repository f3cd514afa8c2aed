package layer

import (
	"slices"
	"testing"
)

// TestChooseAEAD: the listener takes AES-256-GCM only when the offer
// holds it and this CPU has the instructions, ChaCha20-Poly1305 else,
// and skips what it does not know.
func TestChooseAEAD(t *testing.T) {
	aes := AEADChaChaPoly
	if hasAESGCMHardware {
		aes = AEADAESGCM
	}
	for _, tc := range []struct {
		name  string
		offer []AEAD
		want  AEAD
	}{
		{"nothing", nil, AEADChaChaPoly},
		{"chacha only", []AEAD{AEADChaChaPoly}, AEADChaChaPoly},
		{"aes first", []AEAD{AEADAESGCM, AEADChaChaPoly}, aes},
		{"chacha first", []AEAD{AEADChaChaPoly, AEADAESGCM}, aes},
		{"unknown ones", []AEAD{77, AEADAESGCM, 9}, aes},
		{"unknown only", []AEAD{77}, AEADChaChaPoly},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := ChooseAEAD(tc.offer); got != tc.want {
				t.Fatalf("ChooseAEAD(%v) = %v, want %v", tc.offer, got, tc.want)
			}
		})
	}
	if local := LocalAEADs(); local[len(local)-1] != AEADChaChaPoly || slices.Contains(local, AEADAESGCM) != hasAESGCMHardware {
		t.Fatalf("LocalAEADs() = %v with AES-GCM hardware %v", local, hasAESGCMHardware)
	}
}
