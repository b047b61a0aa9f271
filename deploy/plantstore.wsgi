import plantstore
application = plantstore.app
