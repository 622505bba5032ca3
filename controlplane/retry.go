package controlplane

// retryPolicy is each class's published retry budget fraction and
// max retries: the configured ones, unscaled. The one curve that lowers
// the budget with utilization is ext_proc's (retryScale), applied to the
// larger of the policy's predicted utilization and its own in-flight
// ratio; scaling here as well compounded the two (at u = 0.8 the budget
// was 0.2 × 0.4 × 0.6).
func (c *Controller) retryPolicy() (fraction float64, maxRetries uint32) {
	if c.cfg.RetryBudget == 0 {
		return 0, 0
	}
	return c.cfg.RetryBudget, c.cfg.MaxRetries
}
