%%% @doc The two halves check each other at every port start: the port
%%% answers `version' with `#{package => <<"0.2.0">>, protocol => 4}'; the
%%% protocol must be the one this app speaks and the package must have this
%%% app's major.minor version (a patch release of either half may differ).
%%% A port from before the handshake (kem_port < 0.2.0) answers
%%% `unknown_method': a mismatch too.
-module(kem_version).
-export([check/1, protocol/0, app_vsn/0]).

-define(PROTOCOL, 4).

-spec protocol() -> pos_integer().
protocol() -> ?PROTOCOL.

%% @doc This app's version, e.g. <<"0.2.0">>.
-spec app_vsn() -> binary().
app_vsn() ->
    case application:get_key(kem, vsn) of
        {ok, Vsn} -> list_to_binary(Vsn);
        undefined -> vsn_from_app_file()
    end.

%% Not loaded (a tool's port, a test): read kem.app without loading it,
%% which would change the caller's application state.
vsn_from_app_file() ->
    case code:where_is_file("kem.app") of
        non_existing -> <<"unknown">>;
        File ->
            {ok, [{application, kem, Props}]} = file:consult(File),
            list_to_binary(proplists:get_value(vsn, Props, "unknown"))
    end.

%% @doc Judge the port's answer to `version'.
-spec check(term()) -> ok | {error, {version_mismatch, binary()}}.
check({ok, #{package := Package, protocol := ?PROTOCOL}}) when is_binary(Package) ->
    case major_minor(Package) =:= major_minor(app_vsn()) of
        true -> ok;
        false -> mismatch(["the Python package kem_port is ", Package, ", this kem app is ",
                           app_vsn(), ": install the matching kem_port (kem_python:install/1)"])
    end;
check({ok, #{protocol := Protocol}}) ->
    mismatch(["the port speaks protocol ", io_lib:format("~p", [Protocol]),
              ", this kem app speaks ", integer_to_list(?PROTOCOL),
              ": install the matching kem_port (kem_python:install/1)"]);
check({error, {unknown_method, _}}) ->
    mismatch(["the Python package kem_port is older than 0.2.0 (it has no `version' method), "
              "this kem app is ", app_vsn(), ": install the matching kem_port (kem_python:install/1)"]);
check(Other) ->
    mismatch(["the port answered ", io_lib:format("~0P", [Other, 8]), " to `version'"]).

major_minor(Vsn) ->
    lists:sublist(binary:split(Vsn, <<".">>, [global]), 2).

mismatch(Parts) ->
    {error, {version_mismatch, iolist_to_binary(Parts)}}.

%%% Tests

-ifdef(TEST).
-include_lib("eunit/include/eunit.hrl").

check_test() ->
    Vsn = app_vsn(),
    [Major, Minor | _] = binary:split(Vsn, <<".">>, [global]),
    Patch = <<Major/binary, ".", Minor/binary, ".99">>,
    ?assertEqual(ok, check({ok, #{package => Vsn, protocol => ?PROTOCOL}})),
    ?assertEqual(ok, check({ok, #{package => Patch, protocol => ?PROTOCOL}})),
    {error, {version_mismatch, Why}} = check({ok, #{package => <<"9.9.0">>, protocol => ?PROTOCOL}}),
    ?assertNotEqual(nomatch, binary:match(Why, <<"9.9.0">>)),
    ?assertMatch({error, {version_mismatch, _}}, check({ok, #{package => Vsn, protocol => 99}})),
    ?assertMatch({error, {version_mismatch, _}}, check({error, {unknown_method, <<"version">>}})),
    ?assertMatch({error, {version_mismatch, _}}, check({error, {bad_args, <<"x">>}})).
-endif.
