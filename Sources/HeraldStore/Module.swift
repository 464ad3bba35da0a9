// HeraldStore module.
