// HeraldCore module.
