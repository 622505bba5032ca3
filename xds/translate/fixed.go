package translate

// FixedClass is a class whose engines have fixed weights, for rigs that run
// no optimizer (`inferlb-lab bench envoy`, the ext_proc and bootstrap tests).
// FixedNode turns such classes into the Node Translate takes, so those rigs
// get the CDS and EDS production publishes, from the one builder.
type FixedClass struct {
	Name    string
	Engines []FixedEngine
}

// FixedEngine is one engine of a FixedClass; Weight is its share (any
// positive scale: Translate normalizes to Options.WeightScale).
type FixedEngine struct {
	ID, Address string
	Weight      float64
}

// FixedNode is the Node of frontend nodeID in region routing classes; every
// engine is healthy. An engine in several classes is one engine (same ID).
func FixedNode(nodeID, region string, classes []FixedClass) Node {
	n := Node{NodeID: nodeID, Region: region, Engines: map[string]Engine{}}
	for _, c := range classes {
		cl := Class{Name: c.Name, Weights: map[string]float64{}}
		for _, e := range c.Engines {
			n.Engines[e.ID] = Engine{ID: e.ID, Address: e.Address, Region: region}
			cl.Weights[e.ID] = e.Weight
		}
		n.Classes = append(n.Classes, cl)
	}
	return n
}
