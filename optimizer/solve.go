package optimizer

import "fmt"

// Solve computes the allocation for p. See the package documentation for
// the model. It returns an error wrapping one of the package's sentinel
// errors for a malformed problem; on ErrNotConverged the returned Solution
// is the last iterate (usable but not at tolerance).
func Solve(p *Problem, opts Options) (*Solution, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	return nil, fmt.Errorf("optimizer: not implemented yet")
}
