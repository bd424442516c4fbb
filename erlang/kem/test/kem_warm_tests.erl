%%% @doc The warm list's pure parts: which shape a call needs, the bounded
%%% newest-first list, and the owner's report-once set.
-module(kem_warm_tests).
-include_lib("eunit/include/eunit.hrl").

shape_of_each_kernel_method_test() ->
    ?assertEqual({<<"double">>, <<"main">>, false}, kem_warm:shape(execute_kernel, {<<"double">>, <<1>>, 2})),
    ?assertEqual({<<"pixelize">>, <<"main">>, true},
                 kem_warm:shape(execute_kernel_with_params, {<<"pixelize">>, <<1>>, <<0:128>>})),
    ?assertEqual({<<"k">>, <<"main">>, false}, kem_warm:shape(execute, {<<"k">>, <<1>>, #{}})),
    ?assertEqual({<<"k">>, <<"other">>, true},
                 kem_warm:shape(execute, {<<"k">>, {shm, <<"/x">>}, #{entry_point => other, params => <<1>>}})),
    ?assertEqual({<<"k">>, <<"e">>, false}, kem_warm:shape(execute, {<<"k">>, <<1>>, #{entry_point => <<"e">>}})),
    ?assertEqual(none, kem_warm:shape(execute, {<<"k">>, <<1>>, #{entry_point => 42}})),
    ?assertEqual(none, kem_warm:shape(ping, {})),
    ?assertEqual(none, kem_warm:shape(stats, {})).

add_keeps_the_newest_within_the_limit_test() ->
    Shapes = [{integer_to_binary(I), <<"main">>, false} || I <- lists:seq(1, 10)],
    List = lists:foldl(fun(S, L) -> element(2, kem_warm:add(S, L, 4)) end, [], Shapes),
    ?assertEqual(lists:sublist(lists:reverse(Shapes), 4), List),
    ?assertEqual({known, List}, kem_warm:add(hd(List), List, 4)),
    ?assertEqual({new, []}, kem_warm:add(hd(Shapes), [], 0)).

note_reports_once_and_stays_bounded_test() ->
    Seen = lists:foldl(fun(I, S) -> kem_warm:note({integer_to_binary(I), <<"main">>, false}, S, 2) end,
                       #{}, lists:seq(1, 100)),
    ?assert(map_size(Seen) =< 8),
    ?assertEqual(#{}, kem_warm:note({<<"a">>, <<"main">>, false}, #{}, 0)),
    ?assertEqual(#{}, kem_warm:note(none, #{}, 32)).
