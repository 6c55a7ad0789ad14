package memcopy_test

import (
	"testing"

	"github.com/charonlimit/charon/internal/copystore"
	"github.com/charonlimit/charon/internal/copystore/copystoretest"
	"github.com/charonlimit/charon/internal/copystore/memcopy"
)

func TestConformance(t *testing.T) {
	copystoretest.Run(t, func(t *testing.T) copystore.Store { return memcopy.New(memcopy.Options{}) })
}

func TestConformanceOneShard(t *testing.T) {
	copystoretest.Run(t, func(t *testing.T) copystore.Store { return memcopy.New(memcopy.Options{Shards: 1}) })
}
