package server

import (
	"github.com/charonlimit/charon/config"
)

// appliedConfig is a configuration in force and where it came from.
type appliedConfig struct {
	cfg *config.Config
	// source is "file" (the ConfigDir Reloader) or the source given to
	// ApplyConfig ("xds"); version is the source's version ("" for files).
	source, version string
}

// ApplyConfig puts cfg in force, as a reload of ConfigDir does, for a
// configuration that comes from elsewhere (an xDS server): the engine
// decides with it from now on, /rlconfig shows it with its source and
// version, the reload counters count a success and
// charon_config_version_info names the version. The first one ends the
// wait of Options.WaitForConfig. Safe for concurrent use; the caller
// applies the configurations of one source in order.
func (s *Server) ApplyConfig(cfg *config.Config, source, version string) {
	s.setConfig(cfg, source, version)
	s.metrics.reloaded(true)
}

// ConfigRejected counts a configuration from elsewhere than ConfigDir that
// did not load (the configuration in force stays); the caller logs why.
func (s *Server) ConfigRejected() { s.metrics.reloaded(false) }

func (s *Server) setConfig(cfg *config.Config, source, version string) {
	s.opts.Engine.SetTree(cfg.Tree)
	s.applied.Store(&appliedConfig{cfg: cfg, source: source, version: version})
	if source != "file" {
		s.metrics.configVersion(source, version)
	}
	if !s.configReady.Swap(true) {
		s.updateHealth()
	}
}
