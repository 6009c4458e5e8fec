package systems

import "go.uber.org/zap"

// nopLogger silences the etcd client's zap logger.
func nopLogger() *zap.Logger { return zap.NewNop() }
