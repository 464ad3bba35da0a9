// HeraldDaemon module.
