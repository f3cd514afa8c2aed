package base

import (
	"testing"

	"go.uber.org/goleak"

	_ "github.com/vlink-dev/vlink/vlink/layers"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
