from feature_defs.dsl import Entity

user = Entity("user", join_key="user_id", description="A marketplace user (buyer, player or creator)")
item = Entity("item", join_key="item_id", description="A 3D item listed in the catalogue")
